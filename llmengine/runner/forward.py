"""One forward over the paged cache: rows of any lengths, packed, with no pad.

`paged_forward` is the eager forward every step can take (prefills, chunks, decodes and
drafts together): the rows' new tokens packed as one sequence `[1, N]`, attention through
`GatheredAttention`, and logits only where someone needs them. Its inputs (`packed_inputs`)
can be built first, apart from the forward, by a caller that must tell which row a fault in
them belongs to (the model runner).
"""

from __future__ import annotations

import torch

from llmengine.kv.paged_cache import PagedKVCache
from llmengine.model.llama import DecoderLayer, LayerRunner, Llama
from llmengine.runner.attention import GatheredAttention, PagedRow

PackedInputs = tuple[torch.Tensor, GatheredAttention]  # a forward's token ids and attention


def packed_inputs(cache: PagedKVCache, rows: list[PagedRow]) -> PackedInputs:
    """What `paged_forward` reads besides the model: the rows' new tokens packed as `[1, N]`,
    and their attention (positions, write slots, block tables). Built apart from the forward
    so that a fault here, which some row's data caused, is told from a fault of the forward."""
    if not rows:
        raise ValueError("paged_forward needs at least one row")
    attention = GatheredAttention(cache, rows)
    return packed_token_ids(rows, cache.device), attention


def packed_token_ids(rows: list[PagedRow], device: torch.device) -> torch.Tensor:
    """The rows' new tokens packed in row order as `[1, N]`."""
    return torch.tensor([[token for row in rows for token in row.token_ids]], device=device)


def paged_forward(
    model: Llama,
    cache: PagedKVCache,
    rows: list[PagedRow],
    run_layer: LayerRunner | None = None,
    logits_at: list[int] | None = None,
    inputs: PackedInputs | None = None,
) -> torch.Tensor:
    """One forward over rows of any lengths; logits `[len(rows), vocab]` at each last new position.

    `run_layer` runs each layer (`llmengine.speed.compiled.CompiledLayers` runs its halves
    compiled); None runs the model eager.
    `logits_at` asks for logits at other new positions instead, by index into the rows' new
    tokens packed in order (row 0's, then row 1's, ...): `[len(logits_at), vocab]`.
    `inputs` are the rows' `packed_inputs` when the caller built them already.
    Computes every new token's position (no pad) and leaves its K/V in the cache, so the next
    call for a row starts at `start_position + len(token_ids)`.
    """
    input_ids, attention = packed_inputs(cache, rows) if inputs is None else inputs
    hidden = model.forward_hidden(
        input_ids, attention.positions, attention, run_layer or DecoderLayer.__call__
    )
    if logits_at is None:
        return model.compute_logits(hidden[0, attention.last_new])
    return model.compute_logits(hidden[0, torch.tensor(logits_at, device=cache.device)])
