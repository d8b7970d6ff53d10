"""Lesson 07's exercises: blocks a growing sequence holds, where a position lives, what is free.

Each checker computes its answer from the paged cache itself: a `PagedWalkthrough` run on the
embedded model, `flat_indices` over a block table, the pool's own count of free blocks.
"""

from __future__ import annotations

import torch

from llmengine.kv.blocks import BlockTable
from llmengine.lessons.exercises import Verdict, check_value, embedded_model
from llmengine.lessons.paged_walkthrough import PagedWalkthrough
from llmengine.runner.attention import flat_indices


def blocks_after_decoding(prompt_tokens: int, steps: int, block_size: int) -> int:
    """Run one sequence through a paged cache: prefill `prompt_tokens`, decode `steps` times;
    the number of blocks its table holds at the end."""
    model = embedded_model()
    room = prompt_tokens + steps + block_size  # blocks enough for every position, and spare
    walk = PagedWalkthrough(model, num_blocks=-(-room // block_size), block_size=block_size)
    vocab = model.config.vocab_size
    walk.add("X", [(7 * index + 1) % vocab for index in range(prompt_tokens)])
    walk.decode(steps)
    return len(walk.tables["X"].block_ids)


def check_blocks_after_decoding(
    answer: int | None, prompt_tokens: int = 37, steps: int = 6, block_size: int = 4
) -> Verdict:
    """How many blocks a sequence holds after its prefill and `steps` decode steps."""
    if answer is None:  # no forward to run for an unanswered exercise
        return check_value(None, None, what="the number of blocks")
    expected = blocks_after_decoding(prompt_tokens, steps, block_size)
    cached = prompt_tokens + steps
    return check_value(
        answer,
        expected,
        what="the number of blocks",
        explain=(
            f"The prefill caches {prompt_tokens} positions and each decode step one more: "
            f"{cached} positions in blocks of {block_size}, the last one "
            f"{cached - (expected - 1) * block_size} positions full."
        ),
    )


def check_flat_index(answer: int | None, table: BlockTable, position: int) -> Verdict:
    """The flat index (into all blocks laid end to end) where `position` of `table` lives."""
    positions = torch.tensor([[position]])
    expected = int(flat_indices(torch.tensor([table.block_ids]), positions, table.block_size)[0, 0])
    block = table.block_ids[position // table.block_size]
    return check_value(
        answer,
        expected,
        what=f"the flat index of position {position}",
        explain=(
            f"Position {position} is in logical block {position // table.block_size}, which is "
            f"physical block {block}, at offset {position % table.block_size}: "
            f"{block} * {table.block_size} + {position % table.block_size}."
        ),
    )


def check_free_blocks(answer: int | None, walk: PagedWalkthrough) -> Verdict:
    """How many blocks of the walkthrough's pool are free now."""
    return check_value(
        answer,
        walk.pool.num_free,
        what="the number of free blocks",
        explain="Every block not in a live sequence's table is back on the pool's free list.",
    )
