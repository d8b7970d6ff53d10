"""How a step tells whose fault a fault is: the rows' work done together, and one by one only
after that raised.

A step does each piece of its rows' work (drawing their tokens, proposing their drafts) for
all rows at once, which is what makes it fast. When that raises, the fault may be one row's
or none's; running the rows one by one tells which, and lets every other row finish exactly
as it would have: a seeded generator is put back where it stood before each row runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def together_or_alone(
    generators: Sequence[torch.Generator | None],
    together: Callable[[], None],
    alone: Callable[[int], None],
) -> dict[int, Exception]:
    """Run `together()`, the work of every row at once (row i drawing from `generators[i]`);
    if it raises, run `alone(i)` for each row instead, each seeded generator put back where it
    stood first (and again if its row raises), so every other row draws exactly what it would
    have drawn. Returns the rows whose lone run raised, with the error: none when the rows
    went together. How a step tells whose fault a fault is."""
    states = [None if generator is None else generator.get_state() for generator in generators]
    try:
        together()
        return {}
    except Exception:
        pass  # a fault of some row, or of none: running them one by one tells which
    failures: dict[int, Exception] = {}
    for row, (generator, state) in enumerate(zip(generators, states, strict=True)):
        if generator is not None:
            generator.set_state(state)
        try:
            alone(row)
        except Exception as error:
            if generator is not None:
                generator.set_state(state)
            failures[row] = error
    return failures
