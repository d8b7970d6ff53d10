"""The position-wise halves of every decoder layer, compiled by `torch.compile`.

A decoder layer is two runs of small operators around one matrix product or two: an
RMSNorm, the rotary rotation, SiLU times the gate, residual additions. Eager, each is its own
operator, with its own dispatch and its own pass over memory; compiled, inductor fuses the
element-wise ones into a few loops and leaves the matrix products to the BLAS library.

Only the halves (`DecoderLayer.before_attention` and `after_attention`) are compiled, not
attention: attention reads a different number of cached keys for every row at every step,
while the halves see nothing but a `[1, N, hidden]` block of packed positions. They are
compiled with a symbolic N (`dynamic=True`), so one graph serves every step's size: a compile
for N = 1 (a one-row decode, which PyTorch specialises) and one for the rest, shared by all
layers because the layer's weights are inputs, not constants. `CompiledLayers` is a
`LayerRunner`: `Llama.forward_hidden(..., run_layer=compiled)` runs the model's own loop
through it.
"""

from __future__ import annotations

import time

import torch

from llmengine.model.llama import AttentionHook, DecoderLayer, Llama


class CompiledLayers:
    """Runs a layer as its two halves through `torch.compile`, attention eager between them."""

    def __init__(self, mode: str | None = None) -> None:
        self.before_attention = torch.compile(
            DecoderLayer.before_attention, dynamic=True, mode=mode
        )
        self.after_attention = torch.compile(DecoderLayer.after_attention, dynamic=True, mode=mode)

    def __call__(
        self,
        layer: DecoderLayer,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attention: AttentionHook | None,
    ) -> torch.Tensor:
        q, k, v = self.before_attention(layer, x, cos, sin)
        return self.after_attention(layer, x, layer.self_attn.attend(q, k, v, attention))

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
                model.forward_hidden(ids, positions, run_layer=self)
        return time.perf_counter() - start
