"""What narrower weights cost in accuracy, measured against the float32 model.

Three measures, from the closest look to the widest:

- the largest logit difference on one passage: how far a single forward drifts;
- greedy agreement: the same prompts continued greedily by both models, and how much of each
  continuation comes out the same before the first token that differs (one different token
  sends the rest of a greedy continuation elsewhere, so later tokens say little);
- perplexity on text the model never saw in training (`HELD_OUT_TEXT`): whether the model
  still predicts Shakespeare as well, which is what a narrower weight must not spoil.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from llmengine.engine import Engine
from llmengine.model.llama import Llama
from llmengine.model.loader import embedded_model_path
from llmengine.model.tokenizer import Tokenizer
from llmengine.sampling import SamplingParams
from llmengine.speed.prepare import PreparedLlama, prepare_for_speed

HELD_OUT_TEXT = embedded_model_path().parent / "held-out" / "macbeth-act-1.txt"


@dataclass(frozen=True)
class Precision:
    """A way to store a model's weights: a dtype, and optionally a quantisation."""

    name: str
    dtype: torch.dtype = torch.float32
    quantization: str | None = None


PRECISIONS = (
    Precision("float32"),
    Precision("bfloat16", torch.bfloat16),
    Precision("int8", quantization="int8"),
    Precision("int8, bfloat16 activations", torch.bfloat16, "int8"),
)


def in_precision(model: Llama, precision: Precision, kernels: str = "measured") -> PreparedLlama:
    """A copy of `model`'s weights (float32, on the CPU) stored and computed in `precision`.

    Built from the state dict, not deep-copied: prepared kernels hold opaque tensors (oneDNN's
    reordered weights) that cannot be copied, and are prepared anew for the new dtype anyway.
    """
    converted = Llama(model.config)
    converted.load_state_dict(model.state_dict())
    converted = converted.eval().requires_grad_(False).to(precision.dtype)
    return prepare_for_speed(converted, kernels, precision.quantization)


def held_out_ids(tokenizer: Tokenizer) -> list[int]:
    """The held-out text as token ids."""
    return tokenizer.encode(HELD_OUT_TEXT.read_text())


@torch.inference_mode()
def perplexity(model: Llama, token_ids: Sequence[int], window: int = 256) -> float:
    """exp(mean negative log-likelihood) of every token after the first of each window, the
    text cut into non-overlapping windows of `window` tokens (the last one shorter)."""
    total, count = 0.0, 0
    for start in range(0, len(token_ids) - 1, window):
        ids = torch.tensor([token_ids[start : start + window + 1]])
        logits = model(ids[:, :-1]).float()
        total += F.cross_entropy(logits[0], ids[0, 1:], reduction="sum").item()
        count += ids.shape[1] - 1
    return math.exp(total / count)


@torch.inference_mode()
def max_logit_difference(model: Llama, reference: Llama, token_ids: Sequence[int]) -> float:
    """The largest |logit - reference logit| over every position of one forward."""
    ids = torch.tensor([list(token_ids)])
    return (model(ids).float() - reference(ids).float()).abs().max().item()


def greedy_continuations(
    model: Llama, prompts: Sequence[Sequence[int]], max_tokens: int
) -> list[list[int]]:
    """Each prompt continued greedily for exactly `max_tokens` tokens (end of text ignored)."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    longest = max(len(prompt) for prompt in prompts) + max_tokens
    engine = Engine(model, num_blocks=len(prompts) * (longest // 16 + 1), num_slots=len(prompts))
    return engine.generate(prompts, [params] * len(prompts))


@dataclass(frozen=True)
class GreedyAgreement:
    """How two sets of greedy continuations of the same prompts compare."""

    sequences: int
    identical: int
    tokens: int  # in each continuation
    mean_prefix: float  # tokens before the first difference, averaged over the sequences

    @property
    def prefix_share(self) -> float:
        return self.mean_prefix / self.tokens


def greedy_agreement(
    reference: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]]
) -> GreedyAgreement:
    """Compare continuations prompt by prompt: identical ones, and the common prefix."""
    if len(reference) != len(outputs) or not reference:
        raise ValueError("need the same, non-zero number of continuations on both sides")
    prefixes = [_common_prefix(a, b) for a, b in zip(reference, outputs, strict=True)]
    identical = sum(list(a) == list(b) for a, b in zip(reference, outputs, strict=True))
    tokens = len(reference[0])
    return GreedyAgreement(len(reference), identical, tokens, sum(prefixes) / len(prefixes))


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return min(len(a), len(b))


def prompts_from(token_ids: Sequence[int], count: int, length: int) -> list[list[int]]:
    """`count` prompts of `length` tokens, spread evenly through `token_ids`."""
    stride = (len(token_ids) - length) // count
    if stride < 1:
        raise ValueError(f"{len(token_ids)} tokens cannot give {count} prompts of {length}")
    return [list(token_ids[i * stride : i * stride + length]) for i in range(count)]
