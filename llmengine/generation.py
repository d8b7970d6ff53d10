"""The plainest generation loop: one request, the whole sequence recomputed every step.

Each new token costs a full forward over the prompt and everything generated so far, so the
work per token grows with the sequence. That cost is the point: it is the baseline the KV
cache lesson measures before caching removes it. The engine is the fast path; this loop is
the reference whose tokens the engine must reproduce.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from llmengine.params import check_logit_bias, check_prompt
from llmengine.sampling import SamplingParams, finish_reason, make_generator, sample_tokens


def _model_device(model: torch.nn.Module) -> torch.device:
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def generate_tokens(
    model: torch.nn.Module,
    prompt_ids: Sequence[int],
    params: SamplingParams | None = None,
    eos_token_ids: Sequence[int] | None = None,
) -> list[int]:
    """Generate token ids after `prompt_ids`, recomputing the full sequence at every step.

    Stops by `finish_reason`: the budget, a stop token or an end-of-sequence token (kept as
    the last element). `eos_token_ids` defaults to the model config's. Returns only the
    generated ids.
    """
    params = params or SamplingParams()
    prompt = check_prompt(prompt_ids, model.config.vocab_size)
    check_logit_bias(params, model.config.vocab_size)
    eos = tuple(model.config.eos_token_ids if eos_token_ids is None else eos_token_ids)
    device = _model_device(model)
    generator = make_generator(params, device)
    sequence = list(prompt)
    generated: list[int] = []
    with torch.inference_mode():
        while True:
            input_ids = torch.tensor([sequence], dtype=torch.long, device=device)
            last_logits = model(input_ids)[:, -1, :]
            history = (sequence, len(prompt))
            token = sample_tokens(last_logits, [params], [generator], [history], [eos])[0]
            generated.append(token)
            sequence.append(token)
            if finish_reason(params, len(generated), token, eos) is not None:
                return generated


def generate_text(
    model: torch.nn.Module, tokenizer: Any, prompt: str, params: SamplingParams | None = None
) -> str:
    """Encode `prompt`, run `generate_tokens`, and decode the completion without special tokens."""
    prompt_ids = tokenizer.encode(prompt)
    completion = generate_tokens(model, prompt_ids, params)
    return tokenizer.decode(completion, skip_special_tokens=True)
