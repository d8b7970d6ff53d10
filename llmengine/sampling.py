"""How a request turns logits into its next token.

`sample_tokens` picks one token per row of a batch of logits (`llmengine.runner.sampler` does
it for a step's scheduled rows); every seeded request draws from its own `torch.Generator`,
and rows are sampled one at a time, so a seeded request gets the same tokens whatever else
shares its batch. Every token stays on the logits' device until `sample_tokens` returns, which
reads them all back in one transfer: on a GPU a step waits for the device once, not once per
row (a top-p row alone waits once more, to cut its candidates). `SamplingParams` and the stop
rule `finish_reason` live in `llmengine.params` (no tensors) and are re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from llmengine.outcome import TokenLogprobs
from llmengine.params import FinishReason, SamplingParams, finish_reason

# One row's tokens so far and how many of them are the prompt: what a penalty looks at.
History = tuple[Sequence[int], int]

__all__ = [
    "FinishReason",
    "History",
    "SamplingParams",
    "TokenLogprobs",
    "adjusted_logits",
    "apply_logit_bias",
    "apply_penalties",
    "candidate_distribution",
    "dense_distribution",
    "draw_one",
    "draw_tokens",
    "finish_reason",
    "make_generator",
    "sample_tokens",
    "suppressed_tokens",
    "token_logprobs",
]


def make_generator(
    params: SamplingParams, device: torch.device | str = "cpu"
) -> torch.Generator | None:
    """A private generator for a seeded request; None (the global RNG) for an unseeded one."""
    if params.seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(params.seed)
    return generator


def apply_logit_bias(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Logits (`[..., vocab]`) with the request's `logit_bias` added to their tokens (a new
    float tensor; the input is kept), or the input itself when it has none. It comes before
    everything else, so it moves the greedy argmax as well as the sampled distribution."""
    if not params.logit_bias:
        return logits
    ids, values = zip(*params.logit_bias, strict=True)
    biased = logits.float().clone()
    biased[..., list(ids)] += torch.tensor(values, dtype=biased.dtype, device=biased.device)
    return biased


def suppressed_tokens(
    params: SamplingParams, num_generated: int, eos_token_ids: Sequence[int], vocab_size: int
) -> list[int]:
    """The tokens of a `vocab_size` vocabulary a request may not draw as its next one, having
    generated `num_generated`: its stop tokens and the end-of-sequence tokens while it has
    fewer than `min_tokens` (vLLM's rule, `ignore_eos` or not), none after. A stop token the
    model cannot produce has no logit to mask and is left out."""
    if num_generated >= params.min_tokens:
        return []
    return sorted(token for token in {*params.stop_token_ids, *eos_token_ids} if token < vocab_size)


def adjusted_logits(
    logits: torch.Tensor, params: SamplingParams, history: History, eos_token_ids: Sequence[int]
) -> torch.Tensor:
    """One row of logits as the draw sees them: the logit bias added, the tokens that would
    end the request too soon (`suppressed_tokens`) set to -inf, then the penalties."""
    adjusted = apply_logit_bias(logits, params)
    token_ids, num_prompt_tokens = history
    num_generated = len(token_ids) - num_prompt_tokens
    banned = suppressed_tokens(params, num_generated, eos_token_ids, logits.shape[-1])
    if banned:
        ids = torch.tensor(banned, dtype=torch.long, device=logits.device)
        adjusted = adjusted.float().index_fill(-1, ids, float("-inf"))
    return apply_penalties(adjusted, params, history)


def apply_penalties(logits: torch.Tensor, params: SamplingParams, history: History) -> torch.Tensor:
    """One row of logits with the request's penalties applied (a new tensor; the input is kept).

    `history` is the row's tokens so far (prompt first) and the prompt's length. The repetition
    penalty comes first and looks at prompt and output alike: a positive logit is divided by
    it and a negative one multiplied, so either way the token becomes less likely. Frequency
    and presence penalties look at the output only, as in OpenAI's API: each subtracts from a
    generated token's logit, once per occurrence or once at all. Rows with no penalty are
    returned unchanged, so they sample exactly as rows without penalties do.
    """
    if not params.has_penalties:
        return logits
    token_ids, num_prompt_tokens = history
    penalised = logits.float().clone()
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(token_ids)), dtype=torch.long, device=logits.device)
        values = penalised[seen]
        penalised[seen] = torch.where(
            values > 0, values / params.repetition_penalty, values * params.repetition_penalty
        )
    output = token_ids[num_prompt_tokens:]
    if output and (params.frequency_penalty or params.presence_penalty):
        ids = torch.tensor(list(output), dtype=torch.long, device=logits.device)
        counts = torch.bincount(ids, minlength=penalised.shape[-1]).to(penalised.dtype)
        penalised -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0)
    return penalised


def token_logprobs(logits: torch.Tensor, token_id: int, k: int) -> TokenLogprobs:
    """The log-probability of `token_id` under one row of raw logits, and the top `k` tokens.

    The log-softmax is of the raw logits, before penalties and temperature; the top tokens are
    sorted stably, so ties keep vocabulary order.
    """
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    top_values, top_ids = torch.sort(logprobs, descending=True, stable=True)
    top = tuple(zip(top_ids[:k].tolist(), top_values[:k].tolist(), strict=True))
    return TokenLogprobs(token_id=token_id, logprob=float(logprobs[token_id]), top=top)


def candidate_distribution(
    logits: torch.Tensor, params: SamplingParams
) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens one row of logits may still draw, most likely first, and their probabilities.

    Temperature, then min-p, top-k and top-p, in vLLM's order: the candidates are sorted once
    (stable, so ties keep vocabulary order), and each cut keeps a prefix of that order, so
    top_k=1 or a tiny top_p leaves exactly the argmax. Min-p compares each token's probability
    with the likeliest's over the whole vocabulary; the tokens it drops stay in the returned
    order with probability 0 (counting them would read back from the device). The
    probabilities are renormalised over what is kept. Greedy params leave the argmax alone,
    with probability 1.
    """
    if params.greedy:
        return logits.argmax().view(1), torch.ones(1, device=logits.device)
    ordered, order = torch.sort(logits.float() / params.temperature, descending=True, stable=True)
    if params.min_p:
        probs = torch.softmax(ordered, dim=-1)
        ordered = ordered.masked_fill(probs < params.min_p * probs[0], float("-inf"))
    if params.top_k:
        ordered = ordered[: params.top_k]
    probs = torch.softmax(ordered, dim=-1)
    if params.top_p < 1.0:
        cumulative = torch.cumsum(probs, dim=-1)
        threshold = torch.tensor([params.top_p], dtype=cumulative.dtype, device=cumulative.device)
        keep = int(torch.searchsorted(cumulative, threshold).item()) + 1
        probs = probs[:keep] / probs[:keep].sum()
    return order[: len(probs)], probs


def dense_distribution(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """`candidate_distribution` spread over the whole vocabulary: `[vocab]` probabilities,
    0 for every token the sampler would never draw."""
    tokens, probs = candidate_distribution(logits, params)
    dense = torch.zeros(logits.shape[-1], dtype=probs.dtype, device=logits.device)
    dense[tokens] = probs
    return dense


def draw_one(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One index drawn with probability `probs` (`[n]`), as a `[1]` tensor on their device.

    The exponential race: the argmax of `probs / q`, `q` independent Exp(1) draws, is index i
    with probability `probs[i]`. It is how `torch.multinomial` draws one sample, so the
    generator gives the same index and moves as far; unlike `torch.multinomial` it does not
    read a validity check back to the host, which on a GPU would wait for the device.
    """
    race = torch.empty_like(probs).exponential_(1, generator=generator)
    return (probs / race).argmax().view(1)


def _sample_row(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> torch.Tensor:
    """One draw from `candidate_distribution` of a single row of logits, as a `[1]` tensor."""
    tokens, probs = candidate_distribution(logits, params)
    return tokens[draw_one(probs, generator)]


def sample_tokens(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
    histories: Sequence[History] | None = None,
    eos_token_ids: Sequence[Sequence[int]] | None = None,
) -> list[int]:
    """One token per row of `logits` (`[rows, vocab]`), row i following `params[i]`: the
    tokens of `draw_tokens`, read back in one transfer."""
    return draw_tokens(logits, params, generators, histories, eos_token_ids).tolist()


def tokens_and_finite(tokens: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """`[2, rows]`: each row's token, and 1 where all of its `logits` `[rows, vocab]` are
    finite: what a step reads back of its rows, in one transfer (`Sampler`)."""
    return torch.stack([tokens, torch.isfinite(logits).all(dim=-1).to(tokens.dtype)])


def greedy_picks(logits: torch.Tensor) -> torch.Tensor:
    """`tokens_and_finite` of each row's argmax (its greedy token, what `draw_tokens` draws
    for a plain greedy row), int64. A decode graph computes these inside itself, so that a
    step of plain greedy rows reads back only them."""
    return tokens_and_finite(logits.argmax(dim=-1), logits)


def draw_tokens(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
    histories: Sequence[History] | None = None,
    eos_token_ids: Sequence[Sequence[int]] | None = None,
) -> torch.Tensor:
    """One token per row of `logits` (`[rows, vocab]`), row i following `params[i]`, as a
    `[rows]` tensor on the logits' device: nothing is read back (but a top-p row's cut).

    Greedy rows that leave their logits alone take the argmax together; the others get their
    logit bias, minimum length and penalties (`adjusted_logits`, from `histories[i]` and the
    row's end tokens `eos_token_ids[i]`, needed when any row has a penalty or a `min_tokens`)
    and are drawn one by one, each with its own generator, so no row's draw depends on
    another row's.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [rows, vocab], got shape {tuple(logits.shape)}")
    rows = logits.shape[0]
    if len(params) != rows or len(generators) != rows:
        raise ValueError(
            f"{rows} rows of logits but {len(params)} params and {len(generators)} generators"
        )
    if histories is None and any(p.has_penalties or p.min_tokens for p in params):
        raise ValueError("a row has penalties or min_tokens, so sampling needs every row's history")
    if eos_token_ids is None and any(row_params.min_tokens for row_params in params):
        raise ValueError("a row has min_tokens, so sampling needs every row's eos_token_ids")
    # What a row that needs neither sees in their place: no tokens, no end tokens.
    histories = [((), 0)] * rows if histories is None else histories
    eos_token_ids = [()] * rows if eos_token_ids is None else eos_token_ids
    tokens = logits.argmax(dim=-1)
    for row, (row_params, generator) in enumerate(zip(params, generators, strict=True)):
        if row_params.greedy and not row_params.adjusts_logits:
            continue
        row_logits = logits[row]
        if row_params.adjusts_logits:
            row_logits = adjusted_logits(row_logits, row_params, histories[row], eos_token_ids[row])
        if row_params.greedy:
            tokens[row : row + 1] = row_logits.argmax().view(1)
        else:
            tokens[row : row + 1] = _sample_row(row_logits, row_params, generator)
    return tokens
