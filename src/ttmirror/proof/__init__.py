"""`ttmirror prove`: the model for an SMT solver, an inductive invariant of the guard, and its
obligations."""
