"""Explorer speed: states, transitions and states per second at the default bound and a larger one.

Run by `make bench-check`; both bounds are measured in the same run, the last line gives the
ratio of their throughputs (how well the explorer scales with the state count).
"""

from __future__ import annotations

import resource

from ttmirror.model.explore import explore
from ttmirror.model.state import Bounds

BOUNDS = {
    "default (D=2 K=2 R=2 T=2)": Bounds(),
    "larger (D=2 K=3 R=2 T=2)": Bounds(slots=3),
}


def main() -> None:
    rates = []
    print(f"{'bound':<28} {'states':>10} {'transitions':>12} {'seconds':>8} {'states/s':>10}")
    for name, bounds in BOUNDS.items():
        ex = explore(bounds)
        rate = len(ex.states) / ex.seconds
        rates.append(rate)
        verdict = "ok" if ex.ok else "VIOLATION"
        print(f"{name:<28} {len(ex.states):>10,} {ex.transitions:>12,} {ex.seconds:>8.2f} "
              f"{rate:>10,.0f}  {verdict}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak memory {peak:,.0f} MiB; throughput larger/default = {rates[1] / rates[0]:.2f}")


if __name__ == "__main__":
    main()
