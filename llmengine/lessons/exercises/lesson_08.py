"""Lesson 08's exercises: one sequence's empty tail, and the waste of a block size the lesson's
table stops short of.

Each checker measures its answer with `measure_tail_waste`, which grows real block tables
through a real pool, as the lesson does.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmengine.lessons.exercises import Verdict, check_value
from llmengine.lessons.fragmentation import measure_tail_waste


def check_tail_of_one_sequence(
    answer: int | None, length: int = 100, block_size: int = 16
) -> Verdict:
    """How many positions of its last block a sequence of `length` tokens leaves empty."""
    waste = measure_tail_waste([length], block_size)
    return check_value(
        answer,
        waste.empty_positions,
        what=f"the empty positions of a {length}-token sequence at block size {block_size}",
        explain=(
            f"{length} tokens fill {waste.blocks} blocks of {block_size} "
            f"({waste.reserved_positions} positions), so {waste.empty_positions} stay empty."
        ),
    )


def check_waste_at_block_size(
    answer: float | None, lengths: Sequence[int], block_size: int = 128
) -> Verdict:
    """The share of the reserved positions left empty, in percent, within a tenth of it."""
    waste = measure_tail_waste(lengths, block_size)
    return check_value(
        answer,
        round(100 * waste.waste_fraction, 2),
        what=f"the waste at block size {block_size} (in percent, within a tenth)",
        tolerance=0.1,
        explain=(
            f"A mean tail of about (b − 1) / 2 = {(block_size - 1) / 2} positions over "
            f"{waste.num_sequences} sequences holding {waste.tokens:,} tokens; measured: "
            f"{waste.empty_positions:,} empty of {waste.reserved_positions:,} reserved."
        ),
    )
