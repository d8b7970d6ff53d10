"""Lesson 31's exercises: what dispatch costs a step, what an overlap can win, and what a
decode graph's step reads back.

The first two are the lesson's arithmetic on numbers the exercise gives (a step's time is
what its parts add up to, or, overlapped, the longer of them); the third asks the code
itself, `greedy_picks`, which every decode graph computes inside its step.
"""

from __future__ import annotations

import torch

from llmengine.lessons.exercises import Verdict, check_value
from llmengine.sampling import greedy_picks


def check_dispatch_share(
    answer: float | None, operators: int = 300, per_operator_us: float = 4.5, step_ms: float = 2.7
) -> Verdict:
    """Exercise 1: the share of a step that dispatching its operators takes alone."""
    expected = operators * per_operator_us / (step_ms * 1e3)
    return check_value(
        answer,
        expected,
        what=f"the share of a {step_ms} ms step spent dispatching {operators} operators",
        tolerance=0.02,
        explain=f"{operators} x {per_operator_us} us = {operators * per_operator_us / 1e3:.2f} "
        f"ms of a {step_ms} ms step, before any operator computes anything.",
    )


def check_overlapped_rate(
    answer: float | None, host_ms: float = 0.35, forward_ms: float = 1.65
) -> Verdict:
    """Exercise 2: one stream's tokens per second when the host's work of each step runs
    wholly beside the forward, and the forward does not slow down."""
    expected = 1e3 / max(host_ms, forward_ms)
    return check_value(
        answer,
        expected,
        what="tokens per second with the host's work hidden behind the forward",
        tolerance=0.02,
        explain=f"Overlapped, a step takes the longer of the two, {max(host_ms, forward_ms)} "
        f"ms, not their sum, {host_ms + forward_ms:.2f} ms.",
    )


def check_numbers_read_back(answer: int | None, rows: int = 8, vocab: int = 2048) -> Verdict:
    """Exercise 3: how many numbers a decode graph's step of `rows` plain greedy rows reads
    back from where the graph ran, its logits being `[rows, vocab]`."""
    expected = greedy_picks(torch.zeros(rows, vocab)).numel()
    return check_value(
        answer,
        expected,
        what=f"the numbers a step of {rows} plain greedy rows reads back",
        explain="Two per row, its argmax and whether its logits are finite: never the logits.",
    )
