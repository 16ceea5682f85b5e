"""The Hypothesis example database a campaign keeps its failing and covering examples in.

`--database DIR` (the default, `.hypothesis/examples`: the local directory database) or
`--database redis://HOST:PORT/DB`: Hypothesis' own `RedisExampleDatabase`, which any number of
machines share, so a failure found on one replays first on every other. Nothing here is a
database of our own: the spec string picks one of Hypothesis'.
"""

from __future__ import annotations

from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

DEFAULT = ".hypothesis/examples"
ENV = "TTMIRROR_DATABASE"
"""Where `make fuzz-long` (HypoFuzz, through `fuzz_target.py`) finds the spec."""


def open_database(spec: str) -> ExampleDatabase:
    """The database `spec` names; raises ValueError (one line) if it cannot be used."""
    if spec.startswith("redis://"):
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase

        try:
            client = redis.Redis.from_url(spec, socket_connect_timeout=5)
            client.ping()
        except (redis.RedisError, ValueError) as e:
            raise ValueError(f"--database {spec}: cannot reach that Redis server ({e})") from None
        return RedisExampleDatabase(client)
    if "://" in spec:
        raise ValueError(f"--database {spec}: a folder or redis://HOST:PORT/DB")
    return DirectoryBasedExampleDatabase(spec)
