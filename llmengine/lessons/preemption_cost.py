"""What one preemption costs on a GPU: recompute paid in FLOPs against swap paid in PCIe bytes.

A request preempted with a context of L positions comes back one of two ways. Recompute runs a
prefill over all L positions: every layer's weights once per position (2 FLOPs per weight, a
multiply and an add) plus causal attention, whose work grows with L squared. Swap copies the
request's K/V to host memory and back: L positions of K/V, twice, over the PCIe link.
Dividing FLOPs by an achieved prefill rate and bytes by the link's bandwidth gives seconds.

Without attention both costs are linear in L, so their ratio is a property of the model and
the machine alone (`linear_ratio`); attention adds to recompute only, which is what can make
the two cross (`crossover_context`). This is a model, not a measurement: it prices one
preemption in isolation, at the link's rated bandwidth and an assumed fraction of the GPU's
peak, and leaves out whatever a real engine overlaps, batches or caches.

Every public figure below carries where it comes from: `source` is the document that states
it, `read_at` the page this project actually read it on when that is not the same page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from llmengine.lessons.fragmentation import kv_bytes_per_position
from llmengine.model.config import LlamaConfig

PCIE_PAYLOAD_BITS, PCIE_LINE_BITS = 128, 130  # 128b/130b encoding, PCIe 3.0 to 5.0
BITS_PER_BYTE = 8


@dataclass(frozen=True, slots=True)
class Gpu:
    """A GPU by its dense bf16 tensor-core peak (no structured sparsity), in FLOP/s."""

    name: str
    dense_bf16_flops: float
    source: str
    read_at: str


@dataclass(frozen=True, slots=True)
class PcieLink:
    """A PCIe link by its transfer rate per lane (GT/s) and its lane count."""

    name: str
    gigatransfers_per_lane: float
    lanes: int
    source: str
    read_at: str

    @property
    def bytes_per_second(self) -> float:
        """Payload bandwidth in one direction: transfers x lanes x 128/130, in bytes."""
        bits = self.gigatransfers_per_lane * 1e9 * self.lanes * PCIE_PAYLOAD_BITS / PCIE_LINE_BITS
        return bits / BITS_PER_BYTE


@dataclass(frozen=True, slots=True)
class PublicModel:
    """A published Llama, by the `config.json` values that size its forward and its K/V."""

    name: str
    config: LlamaConfig
    source: str
    read_at: str


H100_SXM = Gpu(
    "NVIDIA H100 SXM",
    989.4e12,
    source="NVIDIA H100 datasheet: bf16 tensor core 1,979 TFLOPS with 2:4 sparsity, half dense",
    read_at="https://glennklockwood.com/garden/processors/h100",
)
A100_SXM = Gpu(
    "NVIDIA A100 SXM",
    312e12,
    source="https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
    "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
    read_at="https://glennklockwood.com/garden/processors/A100",
)
PCIE4_X16 = PcieLink(
    "PCIe 4.0 x16",
    16.0,
    16,
    source="PCI-SIG, PCI Express Base Specification 4.0 (16 GT/s, 128b/130b)",
    read_at="https://hpc-notes.pages.dev/reference/pcie",
)
PCIE5_X16 = PcieLink(
    "PCIe 5.0 x16",
    32.0,
    16,
    source="PCI-SIG, PCI Express Base Specification 5.0 (32 GT/s, 128b/130b)",
    read_at="https://firmwaresecurity.com/2019/05/31/pcie-5-0-spec-released/",
)

# Achieved prefill throughput as a share of dense peak. A published estimate for inference
# prefill is 30 to 50 percent (ACHIEVED_PREFILL_SOURCE); the top of that range is the
# assumption most favourable to recompute, so a verdict for swap does not rest on it.
PUBLISHED_PREFILL_RANGE = (0.30, 0.50)
ACHIEVED_PREFILL_FRACTION = PUBLISHED_PREFILL_RANGE[1]
ACHIEVED_PREFILL_SOURCE = "https://zeroentropy.dev/concepts/mfu/"


def _llama(**values: Any) -> LlamaConfig:
    return LlamaConfig.from_dict({"model_type": "llama", "torch_dtype": "bfloat16", **values})


# The config.json values that matter here; the rotary settings do not change a FLOP or a byte.
LLAMA_3_2_1B = PublicModel(
    "Llama 3.2 1B",
    _llama(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        max_position_embeddings=131072,
        tie_word_embeddings=True,
    ),
    source="https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json",
    read_at="https://huggingface.co/Emm9625/Llama-3.2-1B-chatml/blob/main/config.json",
)
LLAMA_3_1_8B = PublicModel(
    "Llama 3.1 8B",
    _llama(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=131072,
        tie_word_embeddings=False,
    ),
    source="https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json",
    read_at="https://huggingface.co/NbAiLab/nb-llama-3.1-8B/blob/main/config.json",
)
# The model card's parameter count for Llama 3.2 1B ("1B (1.23B)"), to check `parameter_count`.
LLAMA_3_2_1B_CARD_PARAMETERS = 1.23e9
LLAMA_3_2_1B_CARD = "https://huggingface.co/meta-llama/Llama-3.2-1B"
LLAMA_3_2_1B_CARD_READ_AT = "https://git.lnyan.com/ZySec-AI/llama-3.2-3b-instruct-abliterated"


def layer_weights(config: LlamaConfig) -> int:
    """The weights one position is multiplied through in one decoder layer.

    The four attention projections (grouped-query: K and V have `num_key_value_heads` heads)
    and the three MLP projections, plus their biases when the config has them.
    """
    hidden, kv_width = config.hidden_size, config.num_key_value_heads * config.head_dim
    q_width = config.num_attention_heads * config.head_dim
    attention = hidden * q_width + 2 * hidden * kv_width + q_width * hidden
    mlp = 3 * hidden * config.intermediate_size
    biases = (q_width + 2 * kv_width + hidden) * config.attention_bias
    biases += (2 * config.intermediate_size + hidden) * config.mlp_bias
    return attention + mlp + biases


def weights_per_position(config: LlamaConfig) -> int:
    """Weights a recomputed position is multiplied through: every decoder layer's.

    The embedding is a lookup, not a product, and the output head is needed only for the
    logits of the last position, so neither is charged per position.
    """
    return config.num_hidden_layers * layer_weights(config)


def parameter_count(config: LlamaConfig) -> int:
    """All parameters: embedding, layers with their two norms, final norm, untied head."""
    embedding = config.vocab_size * config.hidden_size
    head = 0 if config.tie_word_embeddings else embedding
    norms = (2 * config.num_hidden_layers + 1) * config.hidden_size
    return embedding + weights_per_position(config) + norms + head


def attention_flops(config: LlamaConfig, context: int) -> int:
    """Causal attention over `context` positions, every layer, every query head.

    The query at position i scores i + 1 keys and mixes as many values, 2 FLOPs per element
    each, so a head of width d spends 4 d (i + 1); summed over the positions that is
    2 d L (L + 1). Softmax and masking are left out.
    """
    heads = config.num_hidden_layers * config.num_attention_heads
    return 2 * heads * config.head_dim * context * (context + 1)


def recompute_flops(config: LlamaConfig, context: int, *, attention: bool = True) -> int:
    """FLOPs of the prefill that rebuilds `context` positions of K/V: 2 per weight per position,
    plus causal attention unless `attention=False`."""
    linear = 2 * weights_per_position(config) * context
    return linear + (attention_flops(config, context) if attention else 0)


def swap_bytes(config: LlamaConfig, context: int, dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes a swap moves for `context` positions: their K/V out to the host, then back."""
    return 2 * context * kv_bytes_per_position(config, dtype)


def recompute_seconds(
    config: LlamaConfig,
    context: int,
    gpu: Gpu,
    *,
    fraction: float = ACHIEVED_PREFILL_FRACTION,
    attention: bool = True,
) -> float:
    """`recompute_flops` at `fraction` of the GPU's dense bf16 peak."""
    return recompute_flops(config, context, attention=attention) / (fraction * gpu.dense_bf16_flops)


def swap_seconds(
    config: LlamaConfig, context: int, link: PcieLink, dtype: torch.dtype = torch.bfloat16
) -> float:
    """`swap_bytes` at the link's one-way bandwidth: the copy out and the copy back in."""
    return swap_bytes(config, context, dtype) / link.bytes_per_second


def linear_ratio(
    config: LlamaConfig,
    gpu: Gpu,
    link: PcieLink,
    *,
    fraction: float = ACHIEVED_PREFILL_FRACTION,
    dtype: torch.dtype = torch.bfloat16,
) -> float:
    """Recompute seconds over swap seconds with attention left out, the same at every L.

    Per position recompute costs 2 W / (fraction x peak) and swap 2 k / bandwidth, where W is
    `weights_per_position` and k the K/V bytes of one position: the ratio is
    W x bandwidth / (fraction x peak x k). Above 1, swap is the cheaper at every context
    length, since attention only adds to recompute.
    """
    achieved = fraction * gpu.dense_bf16_flops
    weights, kv_bytes = weights_per_position(config), kv_bytes_per_position(config, dtype)
    return weights * link.bytes_per_second / (achieved * kv_bytes)


def crossover_context(
    config: LlamaConfig,
    gpu: Gpu,
    link: PcieLink,
    *,
    fraction: float = ACHIEVED_PREFILL_FRACTION,
    dtype: torch.dtype = torch.bfloat16,
) -> float | None:
    """The context length beyond which swap is cheaper than recompute, attention included.

    Per position, recompute costs (2 W + 2 a (L + 1)) / F with a = layers x heads x head_dim
    and F the achieved FLOP/s, and swap 2 k / B. They are equal at
    L = (k F / B - W) / a - 1. None when recompute is dearer even at the shortest context
    (`linear_ratio` of at least 1): then there is no crossover, swap wins everywhere.
    """
    if linear_ratio(config, gpu, link, fraction=fraction, dtype=dtype) >= 1.0:
        return None
    achieved = fraction * gpu.dense_bf16_flops
    kv_bytes = kv_bytes_per_position(config, dtype)
    per_context = config.num_hidden_layers * config.num_attention_heads * config.head_dim
    flops_per_byte = achieved / link.bytes_per_second
    return (kv_bytes * flops_per_byte - weights_per_position(config)) / per_context - 1.0
