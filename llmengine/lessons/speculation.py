"""Lesson 28's measurements and figures: speculative decoding by prompt lookup, counted and timed.

`generate_counted` runs prompts to completion on a fresh engine, with or without n-gram
speculation, and keeps what a lesson counts: the outputs, the forwards, the positions they
computed, and every drafting row's (proposed, accepted) pair. `acceptance_by_position` turns
those pairs into the share of guesses kept at each position of a guess. `time_runs` times
the same runs with the configurations interleaved round by round, and `speed_rows` reduces
them to one row per batch size and k, which `scripts/bench_speculative.py` writes too.
`sampled_outcomes` replays the sampled rule of `verify_drafts` on a toy distribution.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from llmengine.engine import Engine
from llmengine.kv.blocks import blocks_for_length
from llmengine.model.llama import Llama
from llmengine.params import SamplingParams
from llmengine.speculative.ngram import MAX_NGRAM, MIN_NGRAM, propose_ngram
from llmengine.speculative.verify import verify_drafts

if TYPE_CHECKING:
    from matplotlib.figure import Figure

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


# -- wall clock ------------------------------------------------------------------------------


def time_runs(
    model: Llama,
    prompts: Sequence[Sequence[int]],
    batches: Sequence[int],
    ks: Sequence[int | None],
    max_tokens: int,
    rounds: int,
    proposer: str = "ngram",
) -> dict[tuple[int, int | None], list[Run]]:
    """`generate_counted` for the first `batch` prompts at each k (None: no speculation) with
    `proposer` (prompt lookup, or a draft model's folder), `rounds` times each, the
    configurations interleaved within every round so that a slow spell of the machine hits
    them all; one untimed run of each comes first (a warm-up that also lets measured kernels
    time every row count the timed runs meet)."""
    configurations = [(batch, k) for batch in batches for k in ks]
    for batch, k in configurations:
        generate_counted(model, prompts[:batch], max_tokens, k, proposer)
    timed: dict[tuple[int, int | None], list[Run]] = {key: [] for key in configurations}
    for _ in range(rounds):
        for batch, k in configurations:
            run = generate_counted(model, prompts[:batch], max_tokens, k, proposer)
            timed[batch, k].append(run)
    return timed


@dataclass(frozen=True, slots=True)
class Speed:
    """One batch size and k, timed: the median of the rounds, set against no speculation.

    `forward_cost` is the median time of one forward over that of a forward without
    speculation at the same batch size: what checking the drafts adds to each forward."""

    batch: int
    k: int | None
    forwards: int
    tokens: int
    acceptance: float
    tokens_per_s: float
    forward_ms: float
    forward_cost: float
    speedup: float

    def row(self) -> list[object]:
        return [self.batch, "none" if self.k is None else self.k, self.forwards,
                self.tokens / self.forwards, self.acceptance, self.tokens_per_s,
                self.forward_ms, self.forward_cost, self.speedup]  # fmt: skip


SPEED_HEADERS = ("batch", "k", "forwards", "tokens per forward", "drafts kept", "tokens/s",
                 "ms per forward", "forward / forward without", "speed-up")  # fmt: skip
SPEED_FORMATS = ("d", "", "d", ".2f", ".1%", ",.0f", ".2f", ".2f", ".2f")


def speed_rows(timed: Mapping[tuple[int, int | None], list[Run]]) -> list[Speed]:
    """One `Speed` per configuration of `time_runs` (which must include k=None for each
    batch size), in its order."""
    speeds = []
    for (batch, k), runs in timed.items():
        base = timed[batch, None]
        seconds = statistics.median(run.seconds for run in runs)
        base_seconds = statistics.median(run.seconds for run in base)
        forward_ms = 1e3 * seconds / runs[0].forwards
        base_forward_ms = 1e3 * base_seconds / base[0].forwards
        speeds.append(
            Speed(
                batch,
                k,
                runs[0].forwards,
                runs[0].tokens,
                runs[0].acceptance,
                runs[0].tokens / seconds,
                forward_ms,
                forward_ms / base_forward_ms,
                base_seconds / seconds,
            )  # fmt: skip
        )
    return speeds


def faster_or_slower(speedup: float) -> str:
    """`speedup` (time without / time with) as a comparison that a reference completes:
    "1.40x faster than", "1.25x slower than", or "as fast as" within half a percent."""
    if abs(speedup - 1) < 0.005:
        return "as fast as"
    return f"{speedup:.2f}x faster than" if speedup > 1 else f"{1 / speedup:.2f}x slower than"


# -- the sampled rule ------------------------------------------------------------------------


def sampled_outcomes(
    logits: torch.Tensor, draft: int, params: SamplingParams, trials: int, seed: int = 0
) -> tuple[int, Counter[int]]:
    """`verify_drafts` on one draft, `trials` times with one seeded generator, `logits` the
    distribution at the draft's position: how often the draft was kept, and how often each
    token came out first (the draft when kept, else the replacement)."""
    generator = torch.Generator().manual_seed(seed)
    rows = torch.stack([logits, logits])  # the second row only matters when the draft is kept
    kept, first = 0, Counter[int]()
    for _ in range(trials):
        tokens = verify_drafts(rows, [draft], params, generator)
        kept += len(tokens) == 2
        first[tokens[0]] += 1
    return kept, first


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
