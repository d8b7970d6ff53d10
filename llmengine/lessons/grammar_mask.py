"""Lesson 27's measurements: one constrained request followed step by step, the mask its grammar
put on each step's logits, what the model would have chosen without it, and what the mask
costs next to the forward.

`follow` runs one request through an engine a step at a time and asks for the log-probability
of the model's own favourite at each step (the engine reports raw logits' log-probabilities,
so the favourite is the unmasked top-1). `masks_along` replays the output through a fresh set
of matchers, the engine's own `RequestGrammars`, so the masks are exactly those the sampler
applied. `plot_masks` draws them; `step_rows` tabulates them; `time_steps` and `time_masks`
time a step and the mask alone.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from llmengine.params import SamplingParams
from llmengine.structured.constraint import Constraint
from llmengine.structured.matchers import RequestGrammars

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from llmengine.engine import Engine

# A record the embedded model has never seen: every string bounded, no other key allowed.
PERSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "mood": {"enum": ["happy", "sad", "angry"]},
        "friends": {
            "type": "array",
            "items": {"type": "string", "maxLength": 12},
            "maxItems": 3,
        },
    },
    "required": ["name", "age", "mood", "friends"],
    "additionalProperties": False,
}
PROMPT = "ROMEO:\n"

ALLOWED = "#4c72b0"
CHOSEN = "#c44e52"
FAVOURITE = "#dd8452"


@dataclass(frozen=True, slots=True)
class Followed:
    """One request run to its end: its output tokens, why it ended, and per step the raw
    log-probability of the token kept and the model's own top-1 token with its log-probability."""

    tokens: list[int]
    finish_reason: str | None
    logprobs: list[float]
    favourites: list[int]
    favourite_logprobs: list[float]

    @property
    def agreements(self) -> int:
        """Steps at which the token kept is the model's own favourite."""
        return sum(a == b for a, b in zip(self.tokens, self.favourites, strict=True))


def follow(engine: Engine, prompt_ids: Sequence[int], params: SamplingParams) -> Followed:
    """Run one request alone through `engine`, step by step, with `logprobs=1` (the model's
    top-1 before any mask); the engine is left with nothing unfinished."""
    params = dataclasses.replace(params, logprobs=1)
    request_id = engine.add_request(list(prompt_ids), params)
    logprobs, favourites, favourite_logprobs = [], [], []
    while engine.has_unfinished():
        outcome = engine.step()
        if request_id in outcome.logprobs:
            scored = outcome.logprobs[request_id]
            logprobs.append(scored.logprob)
            favourites.append(scored.top[0][0])
            favourite_logprobs.append(scored.top[0][1])
    request = engine.release(request_id)
    return Followed(
        request.output_token_ids, request.finish_reason, logprobs, favourites, favourite_logprobs
    )


def grammars_like(engine: Engine) -> RequestGrammars:
    """A fresh `RequestGrammars` for the engine's tokenizer, vocabulary and end tokens, with its
    own matchers and timers (the engine's are left alone)."""
    return RequestGrammars(engine.tokenizer, engine.model.config.vocab_size, engine.eos_token_ids)


def masks_along(grammars: RequestGrammars, constraint: Constraint, tokens: Sequence[int]) -> Any:
    """`[len(tokens), vocab]` booleans: row i is the mask before token i, as the engine's
    sampler computes it; each token is then accepted, as the sampler does."""
    grammars.add(-1, SamplingParams(constraint=constraint))
    rows = []
    for token in tokens:
        rows.append(grammars.allowed([-1])[0])
        grammars.accept(-1, token)
    grammars.forget(-1)
    return torch.stack(rows)


def first_mask(grammars: RequestGrammars, constraint: Constraint) -> Any:
    """The mask of a constraint's first step (nothing generated yet), `[vocab]` booleans."""
    grammars.add(-1, SamplingParams(constraint=constraint))
    allowed = grammars.allowed([-1])[0]
    grammars.forget(-1)
    return allowed


def token_text(tokenizer: Any, token: int, eos_token_ids: Sequence[int]) -> str:
    """One token as a table shows it: a code span with spaces as ␣ and newlines as \\n, and the
    end-of-sequence token named."""
    if token in eos_token_ids:
        return "`<eos>`"
    text = tokenizer.decode([token]).replace("\n", "\\n").replace(" ", "␣")
    return f"`{text}`"


def step_rows(
    followed: Followed,
    masks: Any,
    tokenizer: Any,
    eos_token_ids: Sequence[int],
) -> list[list[Any]]:
    """Per step: its number, the text generated before it, the tokens its mask allows and
    their share of the vocabulary, the token kept, the model's favourite, and the raw
    log-probability of each."""
    counts = masks.sum(dim=1).tolist()
    vocab = masks.shape[1]
    rows = []
    for step, token in enumerate(followed.tokens):
        before = tokenizer.decode(followed.tokens[:step]).replace("\n", "\\n")
        rows.append([
            step,
            f"`{before}`" if before else "(nothing yet)",
            counts[step],
            counts[step] / vocab,
            token_text(tokenizer, token, eos_token_ids),
            token_text(tokenizer, followed.favourites[step], eos_token_ids),
            followed.logprobs[step],
            followed.favourite_logprobs[step],
        ])  # fmt: skip
    return rows


def plot_masks(masks: Any, followed: Followed, title: str) -> Figure:
    """Left: every allowed (step, token id) as a tick, with the token kept and the model's
    favourite where they differ. Right: how many tokens each step allows, on a log scale."""
    import matplotlib.pyplot as plt

    steps, vocab = masks.shape
    fig, (ax, counts_ax) = plt.subplots(1, 2, figsize=(9, 5.5), sharey=True, width_ratios=(3, 1))
    where = masks.nonzero().tolist()
    ax.scatter([t for _, t in where], [s for s, _ in where], s=6, marker="|", c=ALLOWED,
               linewidths=0.6, label="allowed")  # fmt: skip
    differ = [s for s in range(steps) if followed.favourites[s] != followed.tokens[s]]
    ax.scatter(followed.tokens, range(steps), s=14, c=CHOSEN, label="token kept")
    ax.scatter([followed.favourites[s] for s in differ], differ, s=18, marker="x", c=FAVOURITE,
               label="the model's favourite, refused")  # fmt: skip
    ax.set(xlim=(-10, vocab + 10), ylim=(steps - 0.5, -0.5), xlabel="token id",
           ylabel="step", title=title)  # fmt: skip
    ax.legend(loc="lower right", fontsize=8)
    counts = masks.sum(dim=1).tolist()
    counts_ax.barh(range(steps), counts, color=ALLOWED)
    counts_ax.set(xscale="log", xlim=(0.8, vocab * 1.5), xlabel="tokens allowed")
    return fig


@dataclass(frozen=True, slots=True)
class StepTimes:
    """Steps of a batch timed one by one: the mean of those that decoded `rows` rows after the
    first step (the prefill), and the mask time the engine's grammars added up meanwhile."""

    rows: int
    steps: int
    step_ms: float
    mask_seconds: float
    num_masks: int

    @property
    def mask_us_per_row(self) -> float:
        return self.mask_seconds / self.num_masks * 1e6 if self.num_masks else 0.0


def time_steps(
    engine: Engine, prompts: Sequence[Sequence[int]], params: SamplingParams
) -> StepTimes:
    """Run `prompts` together, timing every step; keep the decode steps in which every prompt
    still had a row. The engine's `mask_seconds` and `num_masks` are read before and after."""
    grammars = engine.runner.sampler.grammars
    mask_seconds, num_masks = grammars.mask_seconds, grammars.num_masks
    engine.add_requests([list(prompt) for prompt in prompts], params)
    kept, first = [], True
    while engine.has_unfinished():
        start = time.perf_counter()
        outcome = engine.step()
        seconds = time.perf_counter() - start
        if not first and len(outcome.tokens) == len(prompts) and outcome.prefill_rows == 0:
            kept.append(seconds)
        first = False
        for request_id in outcome.finished:
            engine.release(request_id)
    return StepTimes(
        rows=len(prompts),
        steps=len(kept),
        step_ms=sum(kept) / len(kept) * 1e3 if kept else float("nan"),
        mask_seconds=grammars.mask_seconds - mask_seconds,
        num_masks=grammars.num_masks - num_masks,
    )


def time_masks(
    grammars: RequestGrammars, constraint: Constraint, tokens: Sequence[int], repeats: int
) -> float:
    """Microseconds per mask, replaying `tokens` through fresh matchers `repeats` times: the
    mask alone, with no forward around it (its own timer, `grammars.mask_seconds`)."""
    seconds, count = grammars.mask_seconds, grammars.num_masks
    for _ in range(repeats):
        masks_along(grammars, constraint, tokens)
    return (grammars.mask_seconds - seconds) / (grammars.num_masks - count) * 1e6


def compile_ms(engine: Engine, constraint: Constraint) -> float:
    """Milliseconds to read the tokenizer and compile `constraint` with a fresh compiler (what
    the engine pays once per distinct constraint; it caches the result)."""
    start = time.perf_counter()
    grammars_like(engine).compiler.compile(constraint)
    return (time.perf_counter() - start) * 1e3


def accepted_counts(
    grammars: RequestGrammars, constraint: Constraint, tokens: Sequence[int]
) -> list[int]:
    """Per step, the tokens the grammar would accept one at a time (`validate_tokens`, and the
    end token once the grammar is complete): a superset of the mask, which allows only the
    first token of the tokenizer's own spelling wherever the grammar forces the characters."""
    matcher = grammars.compiler.matcher(constraint)
    vocab = grammars.compiler.vocab_size
    counts = []
    for token in tokens:
        accepted = sum(matcher.validate_tokens([other]) == 1 for other in range(vocab))
        counts.append(accepted + int(matcher.is_accepting()))
        matcher.consume_token(token)
    return counts
