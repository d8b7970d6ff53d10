"""Llama, one small piece per class, written to be read top to bottom.

The model computes hidden states for the positions it is given and knows nothing about
caches: attention over earlier positions is delegated to an `AttentionHook`. With no
hook, every call is a plain causal forward over the tokens passed in.

Nor does it know about speed: every projection is a plain `nn.Linear`. `llmengine.speed.prepare`
prepares a loaded model afterwards (fused projections, a kernel chosen for each weight)
without changing what it computes; this file reads the same without it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from llmengine.model.config import LlamaConfig
from llmengine.model.rope import RotaryEmbedding, apply_rotary


class AttentionHook(Protocol):
    """Where a cache plugs in: it stores the new K/V and attends over everything it holds.

    `q` is `[B, S, num_heads, head_dim]`, `k` and `v` are `[B, S, num_kv_heads, head_dim]`
    for the new positions only, rotary already applied. Returns `[B, S, num_heads, head_dim]`.
    """

    def attend(
        self, layer_index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor: ...


def grouped_query_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
) -> torch.Tensor:
    """Scaled dot-product attention in the `[B, S, heads, head_dim]` layout.

    K/V may have fewer heads than Q (grouped-query attention): each K/V head serves
    `num_heads / num_kv_heads` query heads. `mask` is boolean, True where a query
    may see a key, broadcastable to `[B, heads, S_q, S_k]`.
    """
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        attn_mask=mask,
        is_causal=is_causal,
        enable_gqa=q.shape[2] != k.shape[2],
    )
    return out.transpose(1, 2)


def causal_mask(query_positions: torch.Tensor, num_keys: int) -> torch.Tensor:
    """Which cached keys each query may see: key position p is visible from position q if p <= q.

    `query_positions` is `[B, S]`; keys are positions `0 .. num_keys-1` of each row. Returns a
    boolean mask `[B, 1, S, num_keys]` (the 1 broadcasts over heads) for
    `grouped_query_attention`.
    """
    key_positions = torch.arange(num_keys, device=query_positions.device)
    return (key_positions <= query_positions[..., None])[:, None]


class RMSNorm(nn.Module):
    """Scale each vector to unit root-mean-square, then by a learned per-channel weight."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # In float32 whatever the model's dtype, as transformers does; one fused operator for
        # x * rsqrt(mean(x^2) + eps).
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return self.weight * normed.to(x.dtype)


class Attention(nn.Module):
    """Project to queries, keys and values, rotate by position, attend, project back."""

    def __init__(self, config: LlamaConfig, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)

    def qkv_projections(self, x: torch.Tensor) -> torch.Tensor:
        """`q_proj(x)`, `k_proj(x)` and `v_proj(x)` side by side in the last dimension."""
        return torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)

    def project(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values `[B, S, heads, head_dim]`, rotary applied to q and k."""
        batch, seq, _ = x.shape
        heads = self.qkv_projections(x).view(batch, seq, -1, self.head_dim)
        # Queries and keys are rotated by the same angles: one rotation of both, side by side.
        rotated = apply_rotary(heads[:, :, : self.num_heads + self.num_kv_heads], cos, sin)
        q, k = rotated.split([self.num_heads, self.num_kv_heads], dim=2)
        return q, k, heads[:, :, self.num_heads + self.num_kv_heads :]

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attention: AttentionHook | None,
    ) -> torch.Tensor:
        """Causal attention over `k`, `v` alone, or whatever the hook (a cache) holds."""
        if attention is None:
            return grouped_query_attention(q, k, v, is_causal=True)
        return attention.attend(self.layer_index, q, k, v)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attention: AttentionHook | None,
    ) -> torch.Tensor:
        attended = self.attend(*self.project(x, cos, sin), attention)
        return self.o_proj(attended.flatten(2))  # the heads merged, back to the hidden size


class MLP(nn.Module):
    """SwiGLU: a SiLU-gated linear unit, `down(silu(gate(x)) * up(x))`."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        bias = config.mlp_bias
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm residual block: x + attention(norm(x)), then x + mlp(norm(x)).

    Only attention mixes positions; everything else treats each position on its own. The
    block reads as two halves around attention, `before_attention` and `after_attention`,
    because that is where a compiler may take it apart: the halves see one position at a
    time, attention sees a cache (`llmengine.speed.compiled`).
    """

    def __init__(self, config: LlamaConfig, layer_index: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_index)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def before_attention(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Norm, then the rotated queries, keys and values."""
        return self.self_attn.project(self.input_layernorm(x), cos, sin)

    def after_attention(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """From attention's output `[B, S, heads, head_dim]` on: output projection and
        residual, then norm, MLP and residual."""
        x = x + self.self_attn.o_proj(attended.flatten(2))
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attention: AttentionHook | None,
    ) -> torch.Tensor:
        q, k, v = self.before_attention(x, cos, sin)
        return self.after_attention(x, self.self_attn.attend(q, k, v, attention))


# How `Llama.forward_hidden` runs one layer: the layer itself, or its halves compiled.
LayerRunner = Callable[
    [DecoderLayer, torch.Tensor, torch.Tensor, torch.Tensor, AttentionHook | None], torch.Tensor
]


class Llama(nn.Module):
    """Token ids in, next-token logits out.

    Parameter names match the Hugging Face checkpoint's with the `model.` prefix dropped.
    With `tie_word_embeddings` there is no `lm_head`: the embedding matrix is reused.
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.rotary = RotaryEmbedding(config)
        self.layers = nn.ModuleList(
            DecoderLayer(config, index) for index in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head: nn.Linear | None = None
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Plain causal forward, no cache: `[B, S]` token ids to `[B, S, vocab]` logits."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        positions = positions.expand_as(input_ids)
        return self.compute_logits(self.forward_hidden(input_ids, positions))

    def forward_hidden(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attention: AttentionHook | None = None,
        run_layer: LayerRunner = DecoderLayer.__call__,
    ) -> torch.Tensor:
        """Final normed hidden states `[B, S, hidden]` for tokens at the given positions.

        `positions` `[B, S]` drives the rotary angles, so each row may start anywhere.
        `attention` decides what the new queries see; None means causal over `input_ids`.
        `run_layer` runs each layer (the layer's own call unless a compiler says otherwise).
        """
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary(positions)
        for layer in self.layers:
            x = run_layer(layer, x, cos, sin, attention)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Project hidden states to vocabulary logits (only where the caller needs them)."""
        if self.lm_head is None:
            return F.linear(hidden, self.embed_tokens.weight)
        return self.lm_head(hidden)
