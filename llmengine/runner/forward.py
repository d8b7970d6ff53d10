"""One forward over the paged cache: rows of any lengths, packed, with no pad.

`paged_forward` is the eager forward every step can take (prefills, chunks, decodes and
drafts together): the rows' new tokens packed as one sequence `[1, N]`, attention through
`GatheredAttention`, and logits only where someone needs them.
"""

from __future__ import annotations

import torch

from llmengine.kv.paged_cache import PagedKVCache
from llmengine.model.llama import DecoderLayer, LayerRunner, Llama
from llmengine.runner.attention import GatheredAttention, PagedRow


def paged_forward(
    model: Llama,
    cache: PagedKVCache,
    rows: list[PagedRow],
    run_layer: LayerRunner | None = None,
    logits_at: list[int] | None = None,
) -> torch.Tensor:
    """One forward over rows of any lengths; logits `[len(rows), vocab]` at each last new position.

    `run_layer` runs each layer (`llmengine.speed.compiled.CompiledLayers` runs its halves
    compiled); None runs the model eager.
    `logits_at` asks for logits at other new positions instead, by index into the rows' new
    tokens packed in order (row 0's, then row 1's, ...): `[len(logits_at), vocab]`.
    Computes every new token's position (no pad) and leaves its K/V in the cache, so the next
    call for a row starts at `start_position + len(token_ids)`.
    """
    if not rows:
        raise ValueError("paged_forward needs at least one row")
    attention = GatheredAttention(cache, rows)
    input_ids = torch.tensor(
        [[token for row in rows for token in row.token_ids]], device=cache.device
    )
    hidden = model.forward_hidden(
        input_ids, attention.positions, attention, run_layer or DecoderLayer.__call__
    )
    if logits_at is None:
        return model.compute_logits(hidden[0, attention.last_new])
    return model.compute_logits(hidden[0, torch.tensor(logits_at, device=cache.device)])
