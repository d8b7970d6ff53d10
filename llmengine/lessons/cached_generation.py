"""Greedy generation through a contiguous KV cache: prefill once, then one position per step.

The plain loop in `generation.py` recomputes every position at every step. Here each prompt
is computed once (prefill) and its K/V kept in a `ContiguousKVCache`; every later step feeds
only the last sampled token of each live sequence (decode). Greedy tokens must equal the
plain loop's: that equality is what lets a cache be a pure speed-up.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from llmengine.kv.contiguous_cache import ContiguousKVCache, contiguous_forward
from llmengine.model.llama import Llama


def generate_greedy_contiguous(
    model: Llama,
    prompts: Sequence[Sequence[int]],
    max_tokens: int | Sequence[int],
    max_seq_len: int | None = None,
) -> tuple[list[list[int]], ContiguousKVCache]:
    """Generate exactly `max_tokens` greedy tokens per prompt (one budget, or one per prompt).

    Each prompt is prefilled in its own forward (rows of one call must add the same number of
    positions); then every step decodes all sequences that still have budget, together. Each
    row reserves `max_seq_len` positions (default: the longest sequence's need, prompt plus
    budget minus one, since the last token is returned but never fed back). Returns the
    generated ids per prompt and the cache, whose `lengths` say what each row filled.
    """
    budgets = [max_tokens] * len(prompts) if isinstance(max_tokens, int) else list(max_tokens)
    if not prompts or any(not prompt for prompt in prompts):
        raise ValueError("generation needs at least one prompt, and no prompt may be empty")
    if len(budgets) != len(prompts) or min(budgets) < 1:
        raise ValueError(f"need one budget >= 1 per prompt, got {budgets} for {len(prompts)}")
    needed = max(len(prompt) + budget - 1 for prompt, budget in zip(prompts, budgets, strict=True))
    parameter = next(model.parameters())
    cache = ContiguousKVCache(
        model.config,
        max_batch=len(prompts),
        max_seq_len=needed if max_seq_len is None else max_seq_len,
        dtype=parameter.dtype,
        device=parameter.device,
    )
    outputs: list[list[int]] = [[] for _ in prompts]
    with torch.inference_mode():
        for row, prompt in enumerate(prompts):
            input_ids = torch.tensor([list(prompt)], device=parameter.device)
            logits = contiguous_forward(model, cache, input_ids, rows=[row])
            outputs[row].append(int(logits[0, -1].argmax()))
        while live := [row for row, out in enumerate(outputs) if len(out) < budgets[row]]:
            last = torch.tensor([[outputs[row][-1]] for row in live], device=parameter.device)
            logits = contiguous_forward(model, cache, last, rows=live)
            for row, token in zip(live, logits[:, -1].argmax(dim=-1).tolist(), strict=True):
                outputs[row].append(token)
    return outputs, cache
