"""How a request turns logits into its next token.

`sample_tokens` picks one token per row of a batch of logits; every seeded request draws from
its own `torch.Generator`, and rows are sampled one at a time, so a seeded request gets the
same tokens whatever else shares its batch. `SamplingParams` and the stop rule
`finish_reason` live in `llmengine.params` (no tensors) and are re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from llmengine.params import FinishReason, SamplingParams, finish_reason

__all__ = [
    "FinishReason",
    "SamplingParams",
    "candidate_distribution",
    "finish_reason",
    "make_generator",
    "sample_tokens",
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


def candidate_distribution(
    logits: torch.Tensor, params: SamplingParams
) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens one row of logits may still draw, most likely first, and their probabilities.

    Temperature, then top-k, then top-p: the candidates are sorted once (stable, so ties keep
    vocabulary order), and top-k and top-p both cut a prefix of that order, so top_k=1 or a
    tiny top_p leaves exactly the argmax. The probabilities are renormalised over what is
    kept. Greedy params leave the argmax alone, with probability 1.
    """
    if params.greedy:
        return logits.argmax().view(1), torch.ones(1, device=logits.device)
    ordered, order = torch.sort(logits.float() / params.temperature, descending=True, stable=True)
    if params.top_k:
        ordered = ordered[: params.top_k]
    probs = torch.softmax(ordered, dim=-1)
    if params.top_p < 1.0:
        cumulative = torch.cumsum(probs, dim=-1)
        threshold = torch.tensor([params.top_p], dtype=cumulative.dtype, device=cumulative.device)
        keep = int(torch.searchsorted(cumulative, threshold).item()) + 1
        probs = probs[:keep] / probs[:keep].sum()
    return order[: len(probs)], probs


def _sample_row(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> int:
    """One draw from `candidate_distribution` of a single row of logits."""
    tokens, probs = candidate_distribution(logits, params)
    choice = torch.multinomial(probs, num_samples=1, generator=generator)
    return int(tokens[choice].item())


def sample_tokens(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
) -> list[int]:
    """One token per row of `logits` (`[rows, vocab]`), row i following `params[i]`.

    Greedy rows take the argmax together; the others are sampled one by one, each with its
    own generator, so no row's draw depends on another row's.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [rows, vocab], got shape {tuple(logits.shape)}")
    rows = logits.shape[0]
    if len(params) != rows or len(generators) != rows:
        raise ValueError(
            f"{rows} rows of logits but {len(params)} params and {len(generators)} generators"
        )
    tokens = logits.argmax(dim=-1).tolist()
    for row, (row_params, generator) in enumerate(zip(params, generators, strict=True)):
        if not row_params.greedy:
            tokens[row] = _sample_row(logits[row], row_params, generator)
    return tokens
