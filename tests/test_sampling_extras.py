"""Penalties and log-probabilities: each against its formula, then through the engine.

The formulas are vLLM's and OpenAI's: the repetition penalty divides a positive logit and
multiplies a negative one for every token of prompt or output; the frequency penalty subtracts
once per occurrence in the output, the presence penalty once at all. Log-probabilities are the
log-softmax of the raw logits.
"""

from __future__ import annotations

import pytest
import torch

import llmengine
from llmengine.sampling import SamplingParams, apply_penalties, sample_tokens, token_logprobs

LOGITS = torch.tensor([2.0, -1.0, 0.5, -3.0, 1.0, 0.0])


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits() -> None:
    params = SamplingParams(repetition_penalty=2.0)
    history = ([0, 1], 1)  # token 0 only in the prompt, token 1 in the output
    penalised = apply_penalties(LOGITS, params, history)
    expected = LOGITS.clone()
    expected[0] = 2.0 / 2.0
    expected[1] = -1.0 * 2.0
    assert torch.equal(penalised, expected)
    assert torch.equal(LOGITS, torch.tensor([2.0, -1.0, 0.5, -3.0, 1.0, 0.0]))


def test_frequency_and_presence_penalties_count_the_output_only() -> None:
    params = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)
    history = ([4, 2, 2, 2, 5], 1)  # token 4 is the prompt; output 2, 2, 2, 5
    penalised = apply_penalties(LOGITS, params, history)
    expected = LOGITS.clone()
    expected[2] -= 3 * 0.5 + 0.25
    expected[5] -= 1 * 0.5 + 0.25
    assert torch.allclose(penalised, expected)
    assert penalised[4] == LOGITS[4]


def test_no_penalty_leaves_the_row_alone() -> None:
    assert apply_penalties(LOGITS, SamplingParams(), ([0, 1, 2], 1)) is LOGITS


def test_greedy_with_a_penalty_takes_the_argmax_of_the_penalised_logits() -> None:
    logits = LOGITS.unsqueeze(0)
    plain = sample_tokens(logits, [SamplingParams()], [None], [([0], 1)])
    penalised = sample_tokens(
        logits, [SamplingParams(frequency_penalty=2.0)], [None], [([1, 0, 0], 1)]
    )
    assert plain == [0]
    assert penalised == [4]  # token 0: 2.0 - 2 * 2.0 = -2.0; next best is token 4 at 1.0


def test_penalties_without_histories_are_refused() -> None:
    with pytest.raises(ValueError, match="history"):
        sample_tokens(LOGITS.unsqueeze(0), [SamplingParams(presence_penalty=1.0)], [None])


@pytest.mark.parametrize(
    "field, value",
    [
        ("presence_penalty", 2.5),
        ("frequency_penalty", -2.1),
        ("frequency_penalty", float("nan")),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", True),
        ("logprobs", 21),
        ("logprobs", -1),
        ("logprobs", 1.5),
    ],
)
def test_out_of_range_extras_are_refused(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_token_logprobs_are_the_log_softmax_with_sorted_top_tokens() -> None:
    record = token_logprobs(LOGITS, 2, 3)
    expected = torch.log_softmax(LOGITS, dim=-1)
    assert record.token_id == 2
    assert record.logprob == pytest.approx(float(expected[2]))
    assert [token for token, _ in record.top] == [0, 4, 2]
    assert [lp for _, lp in record.top] == pytest.approx(expected[[0, 4, 2]].tolist())
    assert token_logprobs(LOGITS, 2, 0).top == ()


def test_engine_logprobs_match_the_plain_forward(model: llmengine.Llama) -> None:
    prompt = [1, 20, 30, 40]
    engine = llmengine.Engine(model, num_blocks=8, block_size=4, num_slots=2)
    asked = engine.add_request(prompt, SamplingParams(max_tokens=5, logprobs=4))
    silent = engine.add_request(prompt, SamplingParams(max_tokens=5))
    records = []
    while engine.has_unfinished():
        outcome = engine.step()
        assert silent not in outcome.logprobs
        records.append(outcome.logprobs[asked])
    tokens = [record.token_id for record in records]
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + tokens[:-1]]))[0, len(prompt) - 1 :]
    reference = torch.log_softmax(logits.float(), dim=-1)
    for position, record in enumerate(records):
        assert record.logprob == pytest.approx(
            float(reference[position, record.token_id]), abs=1e-4
        )
        assert record.top[0][0] == record.token_id  # greedy: the sampled token is the likeliest
        assert len(record.top) == 4
        assert [lp for _, lp in record.top] == sorted((lp for _, lp in record.top), reverse=True)


def test_penalised_greedy_output_is_the_same_in_a_cramped_pool(model: llmengine.Llama) -> None:
    prompts = [[1, 5 + i, 9, 13, 17] for i in range(4)]
    params = SamplingParams(
        max_tokens=20, repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.2
    )
    roomy = llmengine.Engine(model, num_blocks=64, block_size=4, num_slots=4)
    cramped = llmengine.Engine(model, num_blocks=8, block_size=4, num_slots=4)
    evicted = 0
    expected = roomy.generate(prompts, params)
    ids = [cramped.add_request(prompt, params) for prompt in prompts]
    while cramped.has_unfinished():
        evicted += len(cramped.step().evicted)
    assert evicted > 0
    assert [cramped.request(i).output_token_ids for i in ids] == expected
    assert expected != roomy.generate(prompts, SamplingParams(max_tokens=20))


def test_seeded_sampling_with_penalties_repeats(model: llmengine.Llama) -> None:
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=7, presence_penalty=1.0)
    runs = [
        llmengine.Engine(model, num_blocks=16, block_size=4).generate([[1, 2, 3]], params)
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
