"""A counterexample to induction looked up in the explorer: is its first state reachable?

Reachable means a real bug, with the explorer's shortest path to it; unreachable means the
inductive invariant is too weak there (a strengthening conjunct is missing). The explorer runs at
the counterexample's own bound (its requests, slots, max tokens, preemptions, chunks and
host-sync requests), once per bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..model.actions import Action
from ..model.explore import Exploration, explore
from ..model.state import Bounds, State, validate_bounds
from .concrete import domain_for, pin, pin_params
from .obligations import Cti, Setup
from .relation import Ctx, step
from .symbolic import fresh_params, fresh_state


@dataclass
class Lookup:
    """Where the explorer puts a counterexample's first state."""

    reachable: bool
    path: list[str] = field(default_factory=list)
    """The shortest path to it from the initial state, as action labels."""
    states: int = 0
    """States the explorer visited at the counterexample's bound."""
    why: str = ""
    """Why it could not be looked up, if it could not."""


class Explorer:
    """Explorations by bound, kept for the next lookup at the same bound."""

    def __init__(self) -> None:
        self._done: dict[Bounds, tuple[Exploration, dict[State, int]]] = {}

    def lookup(self, cti: Cti) -> Lookup:
        """Whether the explorer reaches ``cti``'s first state, and its shortest path."""
        try:
            validate_bounds(cti.bounds)
        except ValueError as e:
            return Lookup(False, why=f"outside the explorer's bounds ({e})")
        if cti.bounds not in self._done:
            ex = explore(cti.bounds)
            self._done[cti.bounds] = ex, {st: i for i, st in enumerate(ex.states)}
        ex, index = self._done[cti.bounds]
        node = index.get(cti.before)
        if node is None:
            return Lookup(False, states=len(ex.states))
        return Lookup(True, [a.label() for a, _ in ex.path_to(node)], len(ex.states))

    def accepts(self, cti: Cti) -> bool:
        """The explorer reaches ``cti``'s first state (for `Setup.accept`)."""
        return self.lookup(cti).reachable


def action_name(action: Action) -> str:
    """The obligation an explorer edge belongs to: ``combine@1`` for the combine of queue place
    1, the action's name otherwise."""
    return f"{action.name}@{action.args[0]}" if action.name in PLACED else action.name


PLACED = ("combine", "launch", "readback_issue", "readback_complete", "fault")


def breaks(setup: Setup, state: State, bounds: Bounds) -> list[str]:
    """The conjuncts of the invariant that a model state breaks (none: it satisfies it)."""
    smt = setup.smt
    z = smt.z
    p = fresh_params(smt)
    c = Ctx(smt, p, setup.opts, domain=domain_for(bounds, state))
    s = fresh_state(smt, "s", setup.opts.depth)
    sol = smt.solver(setup.rlimit)
    sol.add(*pin_params(smt, p, bounds), *pin(smt, s, state, bounds))
    out = []
    for cj in setup.invariant:
        sol.push()
        sol.add(z.Not(cj.holds(c, s)))
        if sol.check() == z.sat:
            out.append(cj.name)
        sol.pop()
    return out


def crossing(setup: Setup, bounds: Bounds) -> tuple[Cti, list[str]] | None:
    """Where the explorer's shortest counterexample at ``bounds`` leaves the invariant: the edge
    from a state that satisfies it to one that breaks it (a counterexample to induction that is
    reachable by construction), and the path to its first state; None if the model holds at
    ``bounds`` or the path never leaves the invariant."""
    ex = explore(bounds)
    failure = ex.failure()
    if failure is None:
        return None
    path = ex.path_to(failure[1])
    before = ex.states[0]
    labels: list[str] = []
    for action, node in path:
        after = ex.states[node]
        broken = breaks(setup, after, bounds)
        if broken:
            cti = Cti(action_name(action), broken, before, after, bounds)
            return (cti, labels) if confirms(setup, cti) else None
        before = after
        labels.append(action.label())
    return None


def confirms(setup: Setup, cti: Cti) -> bool:
    """The solver agrees: from ``cti``'s first state, which satisfies the invariant, its action
    leads to a state that breaks it (the consecution query, with the first state pinned)."""
    smt, b = setup.smt, cti.bounds
    z = smt.z
    p = fresh_params(smt)
    c = Ctx(smt, p, setup.opts, domain=domain_for(b, cti.before, cti.after))
    s = fresh_state(smt, "s", setup.opts.depth)
    enabled, post = step(c, cti.action, s)
    sol = smt.solver(setup.rlimit)
    sol.add(*pin_params(smt, p, b), *pin(smt, s, cti.before, b), enabled,
            *[cj.holds(c, s) for cj in setup.invariant],
            *pin(smt, post, cti.after, b),
            z.Not(z.And(*[cj.holds(c, post) for cj in setup.invariant])))
    return bool(sol.check() == z.sat)
