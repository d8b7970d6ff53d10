"""Lesson 29's exercises: each checker right on the answer worked out here by block
arithmetic (each request's blocks at its end, the shared prefix's counted once), wrong on
its neighbours, unanswered on None."""

from __future__ import annotations

from llmengine.kv.blocks import blocks_for_length
from llmengine.lessons.exercises.lesson_29 import check_calm_slots, check_roomy_peak
from llmengine.lessons.watching import (
    BLOCK_SIZE,
    LIVE_POOL,
    LIVE_SLOTS,
    MAX_TOKENS,
    OWN_LEN,
    SHARED_LEN,
)

# A request writes its prompt and every token but the last; the shared blocks are full ones.
OWN_BLOCKS = blocks_for_length(SHARED_LEN + OWN_LEN + MAX_TOKENS - 1, BLOCK_SIZE)
SHARED_BLOCKS = SHARED_LEN // BLOCK_SIZE


def blocks_at_once(requests: int) -> int:
    return requests * (OWN_BLOCKS - SHARED_BLOCKS) + SHARED_BLOCKS


def test_calm_slots() -> None:
    right = max(s for s in range(1, LIVE_SLOTS + 1) if blocks_at_once(s) <= LIVE_POOL)
    assert 1 <= right < LIVE_SLOTS  # the live server's eight slots do preempt
    assert check_calm_slots(right).right is True
    assert check_calm_slots(right + 1).right is False
    assert check_calm_slots(right - 1).right is False
    assert check_calm_slots(None).right is None


def test_roomy_peak() -> None:
    right = blocks_at_once(LIVE_SLOTS)
    assert check_roomy_peak(right).right is True
    assert check_roomy_peak(LIVE_SLOTS * OWN_BLOCKS).right is False  # the prefix counted twice
    assert check_roomy_peak(right - 1).right is False
    assert check_roomy_peak(None).right is None
