"""Checking a guess: which drafted tokens the model keeps, and the one it adds.

A row of k drafted tokens gives k + 1 rows of logits: position j's logits are the model's
distribution for the token after draft j - 1 (the request's last token for j = 0).
- Greedy: keep drafts while each is the model's argmax; the first that is not is replaced
  by the argmax, and if all k are kept, the argmax after the last one is added. The text is
  exactly the text without speculation.
- Sampled: the rule of Leviathan et al. (2023). Draft d was drawn from the proposer's q (a
  draft model's distribution, or a point mass on d for prompt lookup); keep it with
  probability min(1, p(d) / q(d)), where p is the sampler's own distribution (temperature,
  min-p, top-k, top-p); on the first refusal draw from max(p - q, 0), renormalised; if all
  k are kept, draw the next token from p. Each token is then distributed exactly as p,
  whatever the proposer guessed.
Either way the logits carry the request's logit bias first, as the plain sampler's do. A
request with `min_tokens` is not drafted until it has that many tokens (`can_speculate`):
from then on no position's end tokens are masked, so its drafted rows see the logits the
plain sampler would.
"""

from __future__ import annotations

import torch

from llmengine.params import SamplingParams
from llmengine.sampling import apply_logit_bias, dense_distribution, draw_one
from llmengine.scheduling.decision import ScheduledRow, packed_starts
from llmengine.scheduling.request import Request


def verify_drafts(
    logits: torch.Tensor,
    drafts: list[int],
    params: SamplingParams,
    generator: torch.Generator | None,
    draft_probs: torch.Tensor | None = None,
) -> list[int]:
    """The tokens a row keeps, from its `[len(drafts) + 1, vocab]` logits: the accepted
    drafts, then one token of the model's own (1 to len(drafts) + 1 tokens). `draft_probs`
    (`[len(drafts), vocab]`) are the distributions the drafts were drawn from; None for
    drafts picked for sure."""
    if logits.shape[0] != len(drafts) + 1:
        raise ValueError(f"{len(drafts)} drafts need {len(drafts) + 1} rows of logits")
    logits = apply_logit_bias(logits, params)
    if params.greedy:
        targets = logits.argmax(dim=-1).tolist()
        kept = []
        for draft, target in zip(drafts, targets, strict=False):
            if draft != target:
                break
            kept.append(draft)
        return [*kept, targets[len(kept)]]
    kept = []
    for position, draft in enumerate(drafts):
        p = dense_distribution(logits[position], params)
        if draft_probs is None:
            q = torch.zeros_like(p)
            q[draft] = 1.0
        else:
            q = draft_probs[position].to(p)
        # u < p(d) / q(d), without dividing: q(d) > 0 for a drawn draft.
        if float(torch.rand(1, generator=generator, device=p.device)) * q[draft] < p[draft]:
            kept.append(draft)
            continue
        rest = (p - q).clamp(min=0.0)
        return [*kept, int(draw_one(rest / rest.sum(), generator))]
    return [*kept, int(draw_one(dense_distribution(logits[-1], params), generator))]


def can_speculate(params: SamplingParams, num_output_tokens: int = 0) -> bool:
    """Whether a request with `num_output_tokens` generated may carry drafts now: not when its
    sampler needs one position at a time (penalties that move with every token, logprobs per
    token, a grammar's mask), nor while `min_tokens` still masks its end tokens (drafts
    checked against unmasked logits could end it too soon)."""
    return (
        not params.has_penalties
        and params.logprobs is None
        and params.constraint is None
        and num_output_tokens >= params.min_tokens
    )


def cut_at_finish(kept: list[int], request: Request) -> list[int]:
    """`kept` up to the first token that would finish `request` (a stop or end token, or its
    last allowed one), included."""
    for index, token in enumerate(kept):
        if request.finish_reason_after(request.num_output_tokens + index + 1, token):
            return kept[: index + 1]
    return kept


def draft_logits_at(rows: list[ScheduledRow]) -> list[int]:
    """Packed indices of the positions whose logits check a row's drafts: its last token's
    and every draft's but the last (the last one's logits are the row's usual ones); none,
    without a scan of the rows' starts, in a step with no drafts."""
    if not any(row.draft_token_ids for row in rows):
        return []
    starts = packed_starts(rows)
    return [
        start + offset
        for row, start in zip(rows, starts, strict=False)
        if row.draft_token_ids
        for offset in range(row.num_positions - len(row.draft_token_ids) - 1, row.num_positions - 1)
    ]
