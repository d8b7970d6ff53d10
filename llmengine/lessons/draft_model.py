"""Lesson 28's sampled rule and draft model: the draft's cache on the target's block tables, and
the rule checked by sampling.

`shared_blocks` reads an engine speculating with a draft model in the middle of a run: the
block ids each request holds, the two caches' shapes over those blocks, and how far the
draft's K/V there agrees with the target's. With a self-draft (`save_self_draft`) the
draft's one layer is the target's first, so the two caches hold the same layer-0 K/V in the
same blocks. `sampled_outcomes` replays `verify_drafts` on a draft picked for sure (prompt
lookup's), `draft_outcomes` on drafts drawn from a draft's own distribution; `chi_square`
tests the tokens that come out against a distribution, and `kept_share` the share of drafts
kept against the share a rule predicts (a rule can give the right tokens and keep too few).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from llmengine.engine import Engine
from llmengine.kv.paged_cache import PagedKVCache
from llmengine.params import SamplingParams
from llmengine.sampling import dense_distribution, draw_one
from llmengine.speculative.verify import verify_drafts


@dataclass(frozen=True, slots=True)
class SharedBlocks:
    """One request's blocks in both caches: the block ids (one table for both models), its
    positions before the last token, those whose K/V each cache holds, and the largest
    difference between the two caches' layer-0 keys and values over the positions both hold."""

    request_id: int
    block_ids: list[int]
    positions: int
    target_positions: int
    draft_positions: int
    largest_difference: float


def slots(cache: PagedKVCache, block_ids: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
    """The flat cache indices of a sequence's `positions`, through its `block_ids`."""
    size = cache.block_size
    return torch.tensor(
        [block_ids[p // size] * size + p % size for p in positions], dtype=torch.long
    )


def held_positions(cache: PagedKVCache, block_ids: Sequence[int], length: int) -> torch.Tensor:
    """Which of positions 0..length-1 of a sequence on `block_ids` hold K/V in `cache` (a
    key of layer 0 that is not all zero: the cache starts zero-filled)."""
    keys = cache.keys[0].flatten(0, 1)[slots(cache, block_ids, range(length))]
    return keys.flatten(1).abs().amax(dim=1) > 0


def shared_blocks(engine: Engine) -> list[SharedBlocks]:
    """For each running request of an engine with a draft model: its block table and what
    both caches hold in it, over the positions before its last token (which no forward has
    computed yet)."""
    drafter = engine.runner.drafter
    if drafter is None:
        raise ValueError("this engine has no draft model")
    target, draft = engine.runner.cache, drafter.cache
    rows = []
    for request in engine.scheduler.running:
        block_ids = list(request.block_table.block_ids)
        length = len(request.token_ids) - 1
        in_target = held_positions(target, block_ids, length)
        in_draft = held_positions(draft, block_ids, length)
        both = [p for p in range(length) if in_target[p] and in_draft[p]]
        where = slots(target, block_ids, both)
        largest = max(
            float((mine[0].flatten(0, 1)[where] - theirs[0].flatten(0, 1)[where]).abs().max())
            for mine, theirs in ((target.keys, draft.keys), (target.values, draft.values))
        )
        rows.append(
            SharedBlocks(
                request.request_id,
                block_ids,
                length,
                int(in_target.sum()),
                int(in_draft.sum()),
                largest,
            )  # fmt: skip
        )
    return rows


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


def draft_outcomes(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    params: SamplingParams,
    trials: int,
    seed: int = 0,
    told_q: bool = True,
) -> tuple[int, Counter[int]]:
    """`trials` times: draw a draft from the draft model's distribution q (`draft_logits`
    under `params`) and check it with `verify_drafts` against `target_logits`, one seeded
    generator for both. How often the draft was kept, and how often each token came first.
    With `told_q` False the verifier is not given q and applies prompt lookup's rule to the
    same drafts (keep d with probability p(d)): still p, but fewer drafts kept."""
    generator = torch.Generator().manual_seed(seed)
    q = dense_distribution(draft_logits, params)
    drawn_from = q.unsqueeze(0) if told_q else None
    rows = torch.stack([target_logits, target_logits])  # the second only matters when kept
    kept, first = 0, Counter[int]()
    for _ in range(trials):
        draft = int(draw_one(q, generator))
        tokens = verify_drafts(rows, [draft], params, generator, drawn_from)
        kept += len(tokens) == 2
        first[tokens[0]] += 1
    return kept, first


def refused_from_p(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The first token's distribution under a wrong rule, for contrast: keep the draft with
    probability min(1, p/q) as `verify_drafts` does, but draw a refusal's token from p itself
    instead of from (p - q)+ renormalised."""
    overlap = torch.minimum(p, q)
    return overlap + (1 - overlap.sum()) * p


@dataclass(frozen=True, slots=True)
class ChiSquare:
    """Pearson's test of observed counts against a distribution: the statistic, its degrees
    of freedom, and the chance of a statistic at least that large if the counts were drawn
    from the distribution (the p-value)."""

    statistic: float
    degrees: int
    p_value: float


def chi_square(counts: Counter[int], probs: torch.Tensor, smallest: float = 5.0) -> ChiSquare:
    """Pearson's chi-square of `counts` (token to count) against `probs`: tokens expected at
    least `smallest` times each get a bin, the rest share one; the p-value from the
    chi-square distribution's upper tail (the regularised upper incomplete gamma)."""
    total = sum(counts.values())
    expected = probs.double() * total
    observed = torch.zeros_like(expected)
    for token, count in counts.items():
        observed[token] = count
    big = expected >= smallest
    bins_expected = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    bins_observed = torch.cat([observed[big], observed[~big].sum().reshape(1)])
    if bins_expected[-1] < smallest:  # the rest is too small a bin: fold it into the last
        bins_expected, bins_observed = bins_expected[:-1].clone(), bins_observed[:-1].clone()
        bins_expected[-1] += expected[~big].sum()
        bins_observed[-1] += observed[~big].sum()
    statistic = float(((bins_observed - bins_expected) ** 2 / bins_expected).sum())
    degrees = len(bins_expected) - 1
    tail = torch.special.gammaincc(torch.tensor(degrees / 2), torch.tensor(statistic / 2))
    return ChiSquare(statistic, degrees, float(tail) if math.isfinite(statistic) else 0.0)


def fit_verdict(test: ChiSquare, level: float = 0.01) -> str:
    """A chi-square test in words: the statistic, its degrees of freedom, its p-value, and
    whether the counts fit the distribution (they do not when the p-value is below `level`)."""
    fits = test.p_value >= level
    share = f"{test.p_value:.2f}" if fits else f"less than {level}"
    verdict = "the counts fit it" if fits else "the counts do not fit it"
    return (
        f"chi-square {test.statistic:.1f} on {test.degrees} degrees of freedom, "
        f"p-value {share}: {verdict}"
    )


@dataclass(frozen=True, slots=True)
class KeptShare:
    """The share of `trials` drafts kept against the share a rule predicts, measured in the
    binomial standard error of a share of that many draws at the predicted value: within
    `within` standard errors the counts agree with the prediction."""

    share: float
    predicted: float
    standard_error: float
    within: float = 3.0

    @property
    def errors(self) -> float:
        """How many standard errors the share lies from the prediction (signed)."""
        difference = self.share - self.predicted
        if self.standard_error == 0:  # a prediction of 0 or 1: any other share is off
            return math.copysign(math.inf, difference) if difference else 0.0
        return difference / self.standard_error

    @property
    def as_predicted(self) -> bool:
        return abs(self.errors) <= self.within

    def verdict(self) -> str:
        """The comparison in words, the verdict chosen by the counts."""
        apart = f"{abs(self.errors):.1f} standard errors apart (one is {self.standard_error:.3f})"
        if self.as_predicted:
            return f"{apart}, within {self.within:g}: as the rule predicts"
        more_or_fewer = "more" if self.errors > 0 else "fewer"
        return f"{apart}, more than {self.within:g}: {more_or_fewer} drafts kept than predicted"


def kept_share(kept: int, trials: int, predicted: float) -> KeptShare:
    """`kept` of `trials` drafts kept, against a rule's predicted share of them."""
    standard_error = math.sqrt(predicted * (1 - predicted) / trials)
    return KeptShare(kept / trials, predicted, standard_error)
