"""The CUDA attention path, run on the CPU: the backends it allows and the K/V heads it repeats
for a masked call change no number, and an engine taking that path keeps its greedy tokens.

On CUDA the gathered attention runs `attention_without_cudnn` (SDPA held to backends that keep
no plan per shape); `tests/test_cuda.py` checks there that no cuDNN op runs.
"""

from __future__ import annotations

import pytest
import torch
from engine_runs import prompts_for

import llmengine
from llmengine.model.llama import causal_mask, grouped_query_attention
from llmengine.runner import attention
from llmengine.runner.attention import attention_without_cudnn

ROWS, QUERIES, KEYS, HEADS, HEAD_DIM = 3, 2, 11, 4, 8


def qkv(kv_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(kv_heads)
    q = torch.randn(ROWS, QUERIES, HEADS, HEAD_DIM, generator=generator)
    k, v = torch.randn(2, ROWS, KEYS, kv_heads, HEAD_DIM, generator=generator)
    return q, k, v


@pytest.mark.parametrize("kv_heads", [1, 2, HEADS])
@pytest.mark.parametrize("masked", [True, False])
def test_the_cuda_path_computes_the_default_attention(kv_heads: int, masked: bool) -> None:
    q, k, v = qkv(kv_heads)
    # Rows that end at different keys, so the mask hides a different tail in each.
    ends = torch.tensor([[KEYS - 2, KEYS - 1], [4, 5], [7, 8]])
    mask = causal_mask(ends, KEYS) if masked else None
    expected = grouped_query_attention(q, k, v, mask=mask)
    actual = attention_without_cudnn(q, k, v, mask=mask)
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, atol=1e-6, rtol=1e-5)


def test_a_cpu_engine_on_the_cuda_path_keeps_its_tokens(model, monkeypatch) -> None:
    """Prompts of different lengths: every decode step attends through a mask."""
    prompts = prompts_for(5, 6, model.config.vocab_size)
    params = llmengine.SamplingParams(max_tokens=8, ignore_eos=True)

    def engine() -> llmengine.Engine:
        return llmengine.Engine(model, num_blocks=32, block_size=4, num_slots=6)

    expected = engine().generate(prompts, params)
    calls = []

    def cuda_path(device: torch.device):
        calls.append(device)
        return attention_without_cudnn

    monkeypatch.setattr(attention, "sdpa_for", cuda_path)
    assert engine().generate(prompts, params) == expected
    assert calls, "the engine never chose its attention through sdpa_for"
