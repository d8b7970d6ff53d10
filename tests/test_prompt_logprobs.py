"""`SamplingParams(prompt_logprobs=k)`: the logprob of every prompt token after the first,
and its top k, equal to one plain forward over the prompt, however the prefill ran: whole,
in chunks, under prefix caching (whose hits such a request does not take), or recomputed
after a preemption (reported once)."""

from __future__ import annotations

import pytest
import torch

import llmengine
from llmengine.engine import Engine

PROMPTS = [[1, 5, 9, 13, 2, 7, 11, 3, 4, 8, 6, 10, 12, 14, 15, 16, 17], [2, 7, 4], [9]]


def expected_logprobs(model: llmengine.Llama, prompt: list[int], k: int):
    with torch.inference_mode():
        logits = model(torch.tensor([prompt]))[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return [
        (float(logprobs[p - 1, prompt[p]]), logprobs[p - 1].topk(k).indices.tolist())
        for p in range(1, len(prompt))
    ]


def run(engine: Engine, params: llmengine.SamplingParams) -> tuple[dict[int, list], int]:
    """Each prompt's logprobs as the steps reported them, and how many preemptions."""
    ids = engine.add_requests(PROMPTS, [params] * len(PROMPTS))
    got: dict[int, list] = {request_id: [] for request_id in ids}
    evicted = 0
    while engine.has_unfinished():
        outcome = engine.step()
        engine.check_integrity()
        evicted += len(outcome.evicted)
        for request_id, entries in outcome.prompt_logprobs.items():
            got[request_id].extend(entries)
    return {index: got[request_id] for index, request_id in enumerate(ids)}, evicted


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"max_num_batched_tokens": 5},  # prompts prefilled in chunks of up to 5 positions
        {"enable_prefix_caching": True},
        {"num_blocks": 8, "block_size": 4},  # cramped: preemption by recompute
    ],
    ids=["whole", "chunked", "prefix-caching", "preempted"],
)
def test_prompt_logprobs_equal_a_plain_forward(model, options) -> None:
    k = 3
    params = llmengine.SamplingParams(max_tokens=6, ignore_eos=True, prompt_logprobs=k)
    engine = Engine(model, **{"num_blocks": 32, "num_slots": 3, **options})
    if options.get("enable_prefix_caching"):  # warm the cache with the same prompts first
        engine.generate(PROMPTS, llmengine.SamplingParams(max_tokens=2))
    got, evicted = run(engine, params)
    assert (evicted > 0) == (options.get("num_blocks") == 8)
    for index, prompt in enumerate(PROMPTS):
        expected = expected_logprobs(model, prompt, k)
        entries = got[index]
        assert [entry.token_id for entry in entries] == prompt[1:]  # each once, in order
        for entry, (logprob, top) in zip(entries, expected, strict=True):
            assert entry.logprob == pytest.approx(logprob, abs=1e-4)
            assert [token for token, _ in entry.top] == top


def test_prompt_logprobs_leave_the_generated_tokens_alone(model) -> None:
    plain = llmengine.SamplingParams(max_tokens=6, ignore_eos=True)
    scored = llmengine.SamplingParams(max_tokens=6, ignore_eos=True, prompt_logprobs=0)
    expected = Engine(model, num_blocks=32).generate(PROMPTS, plain)
    assert Engine(model, num_blocks=32).generate(PROMPTS, scored) == expected


@pytest.mark.parametrize("value", [-1, 21, 2.0])
def test_prompt_logprobs_out_of_range_are_refused(value) -> None:
    with pytest.raises(ValueError, match="prompt_logprobs"):
        llmengine.SamplingParams(prompt_logprobs=value)
