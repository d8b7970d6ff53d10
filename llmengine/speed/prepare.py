"""A loaded `Llama` prepared for speed: fewer, faster matrix products, the same function.

`llmengine.model.llama` is the model as lesson 01 builds it, one `nn.Linear` per projection, and
knows nothing of this module. `prepare_for_speed` (which `load_model` applies) changes how the
model computes, not what:

- fusion: Q, K and V read the same normed input, and so do gate and up; each set becomes one
  product of their stacked weights (`projections.fuse`), seven products a layer become four.
  The layers' weights become views of the stacked ones, so every parameter keeps its name,
  its shape and its memory, and the state dict is the plain model's;
- kernels: every product multiplies through the kernel prepared for its weight
  (`projections.Product`): measured, packed, eager, or an int8 copy.

It does so in place, by giving the model and its modules prepared subclasses of their classes
(`PreparedLlama`, `FusedAttention`, `FusedMLP`, `PreparedLinear`): the same objects with the
same parameters, each subclass overriding only the method that computes a product. A prepared
model moved or converted with `.to()`, or given new weights by `load_state_dict`, prepares
itself again, so that no product multiplies by stale weights.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch
import torch.nn.functional as F
from torch import nn

from llmengine.model.llama import MLP, Attention, Llama
from llmengine.speed.kernels import KernelMeasurement
from llmengine.speed.projections import Product, check_preparation, fuse, stack

if TYPE_CHECKING:
    from torch.nn.modules.module import _IncompatibleKeys

ModuleT = TypeVar("ModuleT", bound=nn.Module)


def become(module: nn.Module, prepared: type[ModuleT]) -> ModuleT:
    """`module` itself, now an instance of `prepared`: a subclass of its class that overrides
    methods and adds no parameter, so the object, its parameters and their names stay."""
    module.__class__ = prepared
    return cast(ModuleT, module)


class PreparedLinear(nn.Linear):
    """An `nn.Linear` that multiplies through the `Product` prepared for its weight."""

    product: Product

    def prepare(self, kernels: str, quantization: str | None) -> None:
        self.product = Product(self.weight, self.bias, kernels, quantization)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.product(x)


class FusedAttention(Attention):
    """`Attention` whose q, k and v projections are one product (`qkv`), its output prepared."""

    qkv: Product

    def prepare(self, kernels: str, quantization: str | None) -> None:
        weight, bias = fuse([self.q_proj, self.k_proj, self.v_proj])
        self.qkv = Product(weight, bias, kernels, quantization)
        become(self.o_proj, PreparedLinear).prepare(kernels, quantization)

    def qkv_projections(self, x: torch.Tensor) -> torch.Tensor:
        return self.qkv(x)


class FusedMLP(MLP):
    """`MLP` whose gate and up projections are one product (`gate_up`), cut apart after."""

    gate_up: Product

    def prepare(self, kernels: str, quantization: str | None) -> None:
        weight, bias = fuse([self.gate_proj, self.up_proj])
        self.gate_up = Product(weight, bias, kernels, quantization)
        become(self.down_proj, PreparedLinear).prepare(kernels, quantization)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sizes = [self.gate_proj.out_features, self.up_proj.out_features]
        gate, up = self.gate_up(x).split(sizes, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class PreparedLlama(Llama):
    """A `Llama` whose every matrix product is fused where it can be, and prepared.

    `kernels` and `quantization` are how it was prepared; `output_head` is the product of the
    logits (the embedding matrix's, when tied).
    """

    kernels: str
    quantization: str | None
    output_head: Product

    def prepare(self, kernels: str, quantization: str | None) -> None:
        """Fuse and prepare every product from the weights as they are now."""
        self.kernels, self.quantization = kernels, quantization
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        self.output_head = Product(head.weight, None, kernels, quantization)
        for layer in self.layers:
            become(layer.self_attn, FusedAttention).prepare(kernels, quantization)
            become(layer.mlp, FusedMLP).prepare(kernels, quantization)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.output_head(hidden)

    def kernel_measurements(self) -> dict[str, KernelMeasurement]:
        """What `kernels="measured"` timed, by product: `qkv`, `o`, `gate_up`, `down` (the
        same shape in every layer, so measured once) and `head`; empty where nothing was."""
        head, qkv, o, gate_up, down = products(self)[:5]
        named = {"qkv": qkv, "o": o, "gate_up": gate_up, "down": down, "head": head}
        return {
            name: product.measurement
            for name, product in named.items()
            if product.measurement is not None
        }

    def _apply(
        self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True
    ) -> PreparedLlama:
        # `.to()`, `.half()` and the like replace each parameter: prepare from the new ones.
        super()._apply(fn, recurse)
        self.prepare(self.kernels, self.quantization)
        return self

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> _IncompatibleKeys:
        result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        self.prepare(self.kernels, self.quantization)
        return result


def prepare_for_speed(
    model: Llama, kernels: str = "measured", quantization: str | None = None
) -> PreparedLlama:
    """Prepare `model` in place (see the module's docstring) and return it.

    `kernels` chooses each product's kernel for each row count: `"measured"` times every
    candidate on this machine, `"packed"` takes MKL's packed copy for 4 to 48 rows without
    measuring, `"eager"` keeps `F.linear`. `quantization="int8"` multiplies by an int8 copy of
    every weight instead (weight-only, one scale per output channel:
    `llmengine.speed.quantization`).
    A prepared model may be prepared again, another way.
    """
    check_preparation(kernels, quantization)
    prepared = become(model, PreparedLlama)
    prepared.prepare(kernels, quantization)
    return prepared


def products(model: Llama) -> list[Product]:
    """Every matrix product a forward of `model` runs: the output head, then each layer's. A
    prepared model's are fused and prepared (qkv, o, gate/up, down); a plain model's are its
    linear layers one by one (q, k, v, o, gate, up, down), eager `F.linear`."""
    if isinstance(model, PreparedLlama):
        found = [model.output_head]
        for layer in model.layers:
            attention = cast(FusedAttention, layer.self_attn)
            mlp = cast(FusedMLP, layer.mlp)
            output = cast(PreparedLinear, attention.o_proj)
            down = cast(PreparedLinear, mlp.down_proj)
            found += [attention.qkv, output.product, mlp.gate_up, down.product]
        return found
    head = model.embed_tokens if model.lm_head is None else model.lm_head
    found = [Product(head.weight, None, "eager")]
    for layer in model.layers:
        attention, mlp = layer.self_attn, layer.mlp
        linears = (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj)
        linears += (mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        found += [Product(linear.weight, linear.bias, "eager") for linear in linears]
    return found


def fused_weights(model: Llama) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """The weight and bias of every product of a prepared forward, fused, in `products`'
    order. A prepared model's own; a plain model's, with q/k/v and gate/up stacked here into
    new memory."""
    if isinstance(model, PreparedLlama):
        return [(product.weight, product.bias) for product in products(model)]
    head = model.embed_tokens if model.lm_head is None else model.lm_head
    weights: list[tuple[torch.Tensor, torch.Tensor | None]] = [(head.weight, None)]
    for layer in model.layers:
        attention, mlp = layer.self_attn, layer.mlp
        weights += [
            stack([attention.q_proj, attention.k_proj, attention.v_proj]),
            (attention.o_proj.weight, attention.o_proj.bias),
            stack([mlp.gate_proj, mlp.up_proj]),
            (mlp.down_proj.weight, mlp.down_proj.bias),
        ]
    return weights
