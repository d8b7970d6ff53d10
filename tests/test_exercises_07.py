"""Lesson 07's exercise checkers: the right answer, worked out here by another route, is
right; a wrong one is wrong; no answer is unanswered."""

from __future__ import annotations

import pytest

from llmengine.kv.blocks import BlockTable, blocks_for_length
from llmengine.lessons.exercises.lesson_07 import (
    check_blocks_after_decoding,
    check_flat_index,
    check_free_blocks,
)
from llmengine.lessons.paged_walkthrough import PagedWalkthrough


@pytest.mark.parametrize(("prompt", "steps", "block_size"), [(37, 6, 4), (5, 3, 8)])
def test_blocks_after_decoding(prompt: int, steps: int, block_size: int) -> None:
    # The prefill caches the prompt, each decode step one more position.
    expected = blocks_for_length(prompt + steps, block_size)
    assert check_blocks_after_decoding(expected, prompt, steps, block_size).right is True
    assert check_blocks_after_decoding(expected + 1, prompt, steps, block_size).right is False
    assert check_blocks_after_decoding(None, prompt, steps, block_size).right is None


def test_flat_index() -> None:
    table = BlockTable(4)
    table.extend([15, 16, 17, 3, 4, 7])
    table.append(23)
    block, offset = table.location_of(13)
    assert check_flat_index(block * 4 + offset, table, position=13).right is True
    assert check_flat_index(13 + 1, table, position=13).right is False
    assert check_flat_index(None, table, position=13).right is None


def test_free_blocks(model) -> None:
    walk = PagedWalkthrough(model, num_blocks=8, block_size=4)
    walk.add("A", [1, 2, 3, 4, 5])
    walk.add("B", [6, 7])
    walk.decode(3)
    held = sum(len(table.block_ids) for table in walk.tables.values())
    assert check_free_blocks(8 - held, walk).right is True
    assert check_free_blocks(8 - held + 1, walk).right is False
    assert check_free_blocks(None, walk).right is None
