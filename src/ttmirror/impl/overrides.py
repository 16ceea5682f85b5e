"""Decision overrides: subclasses of the mirror's own classes, applied where each is built.

The code that runs on a chip has one path. A class here that a caller may specialise (the
runner, the mirrors, the combine, the probe model, the verifying launch) is built through
`built(base, overrides)`: `base` itself when no override names it (the default, and always on a
chip), else a subclass of `base` and of each override made for it. An override is a direct
subclass of one class of `impl/` that redefines named decision methods of it; it applies to that
class and to every class derived from it (the serving mirrors derive from the probe's). `impl/`
defines none: a caller's planted bugs are overrides, so no planted branch exists in this package.
"""

from __future__ import annotations

import copyreg
from functools import cache
from typing import Any, cast

Overrides = tuple[type, ...]
"""Override classes, each a direct subclass of the `impl/` class it specialises."""
NONE: Overrides = ()


class Built(type):
    """The class of a built class: it pickles as the call that builds it (a runner's state is
    copied by pickling it, and a class made at run time has no importable name)."""


def built[T](base: type[T], overrides: Overrides) -> type[T]:
    """`base`, or the subclass of it and of each override made for it (or for a class it
    derives from), in the order given; the same class for the same arguments."""
    picked = tuple(o for o in overrides if o is not base and issubclass(base, o.__bases__[0]))
    return cast(type[T], _subclass(cast(type, base), picked)) if picked else base


@cache
def _subclass(base: type, picked: Overrides) -> type:
    name = "+".join((base.__name__, *(o.__name__ for o in picked)))
    return Built(name, (*picked, base), {"__module__": base.__module__})


def _reduce(cls: Built) -> tuple[Any, tuple[type, Overrides]]:
    *picked, base = cls.__bases__
    return _subclass, (base, tuple(picked))


copyreg.pickle(Built, _reduce)
