"""The position-wise halves of every decoder layer, compiled by `torch.compile`.

A decoder layer is two runs of small operators around one matrix product or two: an
RMSNorm, the rotary rotation, SiLU times the gate, residual additions. Eager, each is its own
operator, with its own dispatch and its own pass over memory; compiled, inductor fuses the
element-wise ones into a few loops and leaves the matrix products to the BLAS library.

Only the halves are compiled, not attention: attention reads a different number of cached
keys for every row at every step, while the halves see nothing but a `[1, N, hidden]` block of
packed positions. They are compiled with a symbolic N (`dynamic=True`), so one graph serves
every step's size: a compile for N = 1 (a one-row decode, which PyTorch specialises) and one
for the rest, shared by all layers because the layer's weights are inputs, not constants.
"""

from __future__ import annotations

import time

import torch

from llmengine.model.llama import AttentionHook, DecoderLayer, Llama


def before_attention(
    layer: DecoderLayer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A layer up to attention: norm, then the rotated queries, keys and values."""
    return layer.self_attn.project(layer.input_layernorm(x), cos, sin)


def after_attention(layer: DecoderLayer, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
    """A layer from attention's output `[B, S, heads, head_dim]` on: output projection and
    residual, then norm, MLP and residual."""
    x = x + layer.self_attn.o_proj(attended.flatten(2))
    return x + layer.mlp(layer.post_attention_layernorm(x))


class CompiledLayers:
    """`before_attention` and `after_attention` through `torch.compile` with a symbolic number
    of positions, and the forward that runs every layer through them."""

    def __init__(self, mode: str | None = None) -> None:
        self.before_attention = torch.compile(before_attention, dynamic=True, mode=mode)
        self.after_attention = torch.compile(after_attention, dynamic=True, mode=mode)

    def forward_hidden(
        self,
        model: Llama,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attention: AttentionHook | None = None,
    ) -> torch.Tensor:
        """`model.forward_hidden` with each layer's halves compiled and attention between them
        eager (`Attention.attend`)."""
        x = model.embed_tokens(input_ids)
        cos, sin = model.rotary(positions)
        for layer in model.layers:
            q, k, v = self.before_attention(layer, x, cos, sin)
            x = self.after_attention(layer, x, layer.self_attn.attend(q, k, v, attention))
        return model.norm(x)

    def warm_up(self, model: Llama, sizes: tuple[int, ...] = (1, 2)) -> float:
        """Run a causal forward of each size so that every compile happens now.

        Returns the seconds it took: the compile time, which a server pays at start-up instead
        of on its first requests.
        """
        parameter = next(model.parameters())
        start = time.perf_counter()
        with torch.inference_mode():
            for size in sizes:
                ids = torch.zeros((1, size), dtype=torch.long, device=parameter.device)
                positions = torch.arange(size, device=parameter.device)[None]
                self.forward_hidden(model, ids, positions)
        return time.perf_counter() - start
