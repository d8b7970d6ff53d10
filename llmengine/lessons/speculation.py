"""Lesson 28's counts and figures: speculative decoding by prompt lookup, counted.

`generate_counted` runs prompts to completion on a fresh engine, with or without n-gram
speculation, and keeps what a lesson counts: the outputs, the forwards, the positions they
computed, and every drafting row's (proposed, accepted) pair. `acceptance_by_position` turns
those pairs into the share of guesses kept at each position of a guess. The wall clock is
`llmengine.lessons.speculation_cost`'s, the sampled rule `llmengine.lessons.draft_model`'s.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmengine.engine import Engine
from llmengine.kv.blocks import blocks_for_length
from llmengine.model.llama import Llama
from llmengine.params import SamplingParams
from llmengine.speculative.ngram import MAX_NGRAM, MIN_NGRAM, propose_ngram

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from llmengine.lessons.speculation_cost import Speed

# Character names the Tiny-Shakespeare model knows: each opens a speech.
PROMPTS = ("ROMEO:\n", "JULIET:\n", "KING HENRY:\n", "First Citizen:\n", "HAMLET:\n",
           "LADY MACBETH:\n", "GLOUCESTER:\n", "MENENIUS:\n", "DUKE VINCENTIO:\n",
           "QUEEN MARGARET:\n", "PETRUCHIO:\n", "CORIOLANUS:\n", "BRUTUS:\n", "ISABELLA:\n",
           "LUCIO:\n", "NURSE:\n")  # fmt: skip
BLOCK_SIZE = 16


@dataclass(frozen=True, slots=True)
class Run:
    """One engine run to completion: what it wrote and what it cost.

    `drafts` holds one (proposed, accepted) pair for each row that carried drafts in some
    step (after the scheduler cut them to the request's budget); `positions` sums the
    positions every forward computed (prompts, decode rows and drafts). `streams` gives, for
    each prompt, the forwards its request took part in: the forwards it would take alone,
    since greedy drafts depend on the request's own tokens only. `draft_forwards` counts a
    draft model's forwards (0 for prompt lookup, which runs none)."""

    k: int | None
    outputs: list[list[int]]
    forwards: int
    streams: list[int]
    positions: int
    drafts: list[tuple[int, int]]
    seconds: float
    draft_forwards: int = 0

    @property
    def tokens(self) -> int:
        return sum(len(output) for output in self.outputs)

    @property
    def proposed(self) -> int:
        return sum(proposed for proposed, _ in self.drafts)

    @property
    def accepted(self) -> int:
        return sum(accepted for _, accepted in self.drafts)

    @property
    def acceptance(self) -> float:
        """The share of proposed tokens the model kept (NaN when nothing was proposed)."""
        return self.accepted / self.proposed if self.proposed else float("nan")


def engine_for(model: Llama, prompts: Sequence[Sequence[int]], max_tokens: int,
               k: int | None, proposer: str = "ngram") -> Engine:  # fmt: skip
    """A fresh engine with a slot for every prompt and blocks for every request's longest
    sequence (drafts included), so that nobody waits and nobody is preempted; `proposer` is
    "ngram" or a draft model's folder."""
    longest = max(len(prompt) for prompt in prompts) + max_tokens + (k or 0) + 1
    speculation = {} if k is None else {"speculative": proposer, "num_speculative_tokens": k}
    return Engine(
        model,
        num_blocks=len(prompts) * blocks_for_length(longest, BLOCK_SIZE),
        block_size=BLOCK_SIZE,
        num_slots=len(prompts),
        **speculation,
    )


def generate_counted(
    model: Llama,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    k: int | None = None,
    proposer: str = "ngram",
) -> Run:
    """Greedy decoding of `prompts` (`max_tokens` each, past the end token) on a fresh
    engine, speculating with up to `k` drafts from `proposer` (prompt lookup, or a draft
    model's folder; k None: no speculation); the wall clock counts from adding the
    requests to the last step."""
    engine = engine_for(model, prompts, max_tokens, k, proposer)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    forwards = positions = 0
    drafts: list[tuple[int, int]] = []
    rows: Counter[int] = Counter()
    draft_forwards = 0
    if engine.runner.drafter is not None:  # every draft forward embeds its tokens once

        def count_forward(*_: object) -> None:
            nonlocal draft_forwards
            draft_forwards += 1

        engine.runner.drafter.model.embed_tokens.register_forward_hook(count_forward)
    start = time.perf_counter()
    ids = engine.add_requests(prompts, params)
    while engine.has_unfinished():
        outcome = engine.step()
        forwards += 1
        positions += outcome.forward_tokens
        drafts.extend(outcome.drafts.values())
        rows.update(outcome.row_positions.keys())
    seconds = time.perf_counter() - start
    outputs = [engine.release(request_id).output_token_ids for request_id in ids]
    streams = [rows[i] for i in ids]
    return Run(k, outputs, forwards, streams, positions, drafts, seconds, draft_forwards)


@dataclass(frozen=True, slots=True)
class Position:
    """Position j of a guess (0 is the first drafted token): how many guesses reached it, and
    how many of those the model kept there (a guess keeps position j iff it keeps more than j)."""

    position: int
    proposed: int
    accepted: int

    @property
    def rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else float("nan")


def acceptance_by_position(drafts: Iterable[tuple[int, int]], k: int) -> list[Position]:
    """For each position 0..k-1, the guesses at least that long and those kept past it."""
    pairs = list(drafts)
    return [
        Position(
            j,
            sum(proposed > j for proposed, _ in pairs),
            sum(accepted > j for _, accepted in pairs),
        )
        for j in range(k)
    ]


def guess_lengths(drafts: Iterable[tuple[int, int]], k: int) -> list[int]:
    """How many guesses had each length 1..k (prompt lookup proposes fewer than k when the
    match sits near the end of the text, and the budget may cut a guess)."""
    counts = Counter(proposed for proposed, _ in drafts)
    return [counts[length] for length in range(1, k + 1)]


@dataclass(frozen=True, slots=True)
class Guess:
    """One step of one stream: the output tokens written before it (`at`), the length of the
    suffix prompt lookup matched (0: none), the guess, and how many of it the model kept."""

    at: int
    suffix: int
    guess: list[int]
    kept: int


def matched_suffix(token_ids: Sequence[int], k: int) -> int:
    """The length of the suffix whose earlier occurrence `propose_ngram` uses (0: none)."""
    for n in range(MAX_NGRAM, MIN_NGRAM - 1, -1):
        if propose_ngram(token_ids, k, max_ngram=n, min_ngram=n):
            return n
    return 0


def replay_guesses(prompt: Sequence[int], output: Sequence[int], k: int) -> list[Guess]:
    """The decode steps of one greedy stream with up to `k` drafts, replayed from its output
    without speculation (the same text, token for token): each step proposes from the tokens
    so far, cut to what `max_tokens = len(output)` leaves, keeps the drafts that agree with
    the output, and adds one token. The prefill writes the first token, so the stream takes
    `1 + len(replay_guesses(...))` forwards."""
    guesses, at = [], 1
    while at < len(output):
        context = [*prompt, *output[:at]]
        guess = propose_ngram(context, min(k, len(output) - at - 1))
        kept = 0
        while kept < len(guess) and guess[kept] == output[at + kept]:
            kept += 1
        guesses.append(Guess(at, matched_suffix(context, k) if guess else 0, guess, kept))
        at += kept + 1
    return guesses


# -- figures ---------------------------------------------------------------------------------


def plot_acceptance(by_k: Mapping[int, list[Position]], per_forward: Mapping[object, float],
                    title: str) -> Figure:  # fmt: skip
    """Left: the share of guesses kept at each position, one line per k. Right: tokens per
    forward for each k (the label `none` for no speculation)."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9.0, 3.6), width_ratios=(3, 2))
    for k, positions in by_k.items():
        left.plot([p.position + 1 for p in positions], [p.rate for p in positions],
                  marker="o", label=f"k = {k}")  # fmt: skip
    left.set_xlabel("position in the guess (1 = first drafted token)")
    left.set_ylabel("guesses kept at that position")
    left.set_ylim(0, 1)
    left.set_xticks(range(1, max(by_k) + 1))
    left.legend()
    labels = [str(label) for label in per_forward]
    bars = right.bar(labels, list(per_forward.values()), color="tab:blue")
    right.bar_label(bars, fmt="%.2f")
    right.set_xlabel("k (most tokens guessed)")
    right.set_ylabel("tokens per forward")
    right.set_ylim(0, max(per_forward.values()) * 1.2)
    fig.suptitle(title)
    return fig


def plot_speedups(speeds: Sequence[Speed], title: str) -> Figure:
    """Speed-up over no speculation against the batch size, one line per k, with the line
    of no change."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    batches = sorted({speed.batch for speed in speeds})
    for k in sorted({speed.k for speed in speeds if speed.k is not None}):
        line = [s for s in speeds if s.k == k]
        ax.plot([s.batch for s in line], [s.speedup for s in line], marker="o", label=f"k = {k}")
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--", label="no speculation")
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(batch) for batch in batches])
    ax.set_xlabel("requests decoding together (batch)")
    ax.set_ylabel("tokens/s with / without speculation")
    ax.set_title(title)
    ax.legend()
    return fig
