"""The shape of a Llama model, read from a Hugging Face `config.json`.

Checkpoints in the wild store rotary settings in two layouts: older files (and Llama 3.x
releases) put `rope_theta` and `rope_scaling` at the top level, transformers 5 writes one
`rope_parameters` dict. Both are read into the same `LlamaConfig`, so the model never
needs to know which layout a file used.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SUPPORTED_ROPE_TYPES = ("default", "llama3")
REQUIRED_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "max_position_embeddings",
)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(slots=True)
class Llama3RopeScaling:
    """Llama 3.1's frequency scaling: slow rotary frequencies are divided by `factor`.

    Wavelengths longer than `original_max_position_embeddings / low_freq_factor` are
    scaled, shorter than `... / high_freq_factor` are kept, and those in between are blended.
    """

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(slots=True)
class LlamaConfig:
    """Everything needed to build a Llama and check a checkpoint against it."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Llama3RopeScaling | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    dtype: torch.dtype = torch.float32

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """The end-of-sequence ids as a tuple, whether the file gave one id, a list or none."""
        if self.eos_token_id is None:
            return ()
        if isinstance(self.eos_token_id, int):
            return (self.eos_token_id,)
        return tuple(self.eos_token_id)

    @classmethod
    def from_file(cls, path: str | Path) -> LlamaConfig:
        """Read a `config.json`; a file that is not a Llama config raises ValueError naming it."""
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"{path}: file not found (a Llama checkpoint needs config.json)")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not valid JSON ({error})") from error
        return cls.from_dict(raw, source=str(path))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config.json") -> LlamaConfig:
        """Build a config from a parsed `config.json`; `source` names the file in errors."""
        if raw.get("model_type") != "llama":
            raise ValueError(
                f"{source}: not a Llama checkpoint (model_type is {raw.get('model_type')!r})"
            )
        missing = [key for key in REQUIRED_KEYS if key not in raw]
        if missing:
            raise ValueError(f"{source}: missing required keys {missing}")
        if raw.get("hidden_act", "silu") != "silu":
            raise ValueError(f"{source}: unsupported hidden_act {raw['hidden_act']!r}")
        heads = raw["num_attention_heads"]
        kv_heads = raw.get("num_key_value_heads") or heads
        if heads % kv_heads:
            raise ValueError(
                f"{source}: num_attention_heads ({heads}) is not a multiple of "
                f"num_key_value_heads ({kv_heads})"
            )
        rope_theta, rope_scaling = _read_rope(raw, source)
        return cls(
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            tie_word_embeddings=raw.get("tie_word_embeddings", False),
            attention_bias=raw.get("attention_bias", False),
            mlp_bias=raw.get("mlp_bias", False),
            max_position_embeddings=raw["max_position_embeddings"],
            bos_token_id=raw.get("bos_token_id"),
            eos_token_id=raw.get("eos_token_id"),
            dtype=_read_dtype(raw, source),
        )


def _read_rope(raw: dict[str, Any], source: str) -> tuple[float, Llama3RopeScaling | None]:
    """Return (theta, llama3 scaling or None) from either rotary layout."""
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"{source}: unsupported rope type {rope_type!r} "
            f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    if rope_type == "default":
        return float(theta), None
    try:
        scaling = Llama3RopeScaling(
            factor=float(params["factor"]),
            low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position_embeddings=int(
                params.get("original_max_position_embeddings", raw.get("max_position_embeddings"))
            ),
        )
    except KeyError as error:
        raise ValueError(f"{source}: llama3 rope scaling lacks {error}") from error
    return float(theta), scaling


def _read_dtype(raw: dict[str, Any], source: str) -> torch.dtype:
    """The checkpoint's stored dtype (`dtype` in transformers 5, `torch_dtype` before)."""
    name = raw.get("dtype") or raw.get("torch_dtype") or "float32"
    if name not in DTYPES:
        raise ValueError(f"{source}: unsupported dtype {name!r}")
    return DTYPES[name]
