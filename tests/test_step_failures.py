"""A step whose logits for some rows are not finite fails those requests alone: they get no
token and are aborted, every other row goes on with exactly the tokens it would have had,
and the pool stays whole."""

from __future__ import annotations

import pytest
import torch

import llmengine
import llmengine.runner.model_runner as runner_module
from llmengine.engine import Engine

PROMPTS = [[1, 5, 9, 13], [2, 7], [3, 4, 8, 6, 10], [11, 12, 14]]
PARAMS = llmengine.SamplingParams(max_tokens=8, ignore_eos=True)


def poisoned_forward(poisoned_step: int, row: int, value: float):
    """`paged_forward` that writes `value` into one row's logits at one step."""
    real = runner_module.paged_forward
    calls = {"count": 0}

    def forward(*args, **kwargs) -> torch.Tensor:
        logits = real(*args, **kwargs)
        calls["count"] += 1
        if calls["count"] == poisoned_step:
            logits[row, 3] = value
        return logits

    return forward


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_logits_fail_only_their_request(model, monkeypatch, value) -> None:
    expected = Engine(model, num_blocks=32, num_slots=4).generate(PROMPTS, PARAMS)
    engine = Engine(model, num_blocks=32, num_slots=4)
    ids = engine.add_requests(PROMPTS, [PARAMS] * len(PROMPTS))
    # Step 3 is a decode of all four rows; row 1 is request ids[1].
    monkeypatch.setattr(runner_module, "paged_forward", poisoned_forward(3, 1, value))
    failed: dict[int, str] = {}
    while engine.has_unfinished():
        outcome = engine.step()
        engine.check_integrity()
        assert not set(outcome.failed) & set(outcome.tokens)
        failed.update(outcome.failed)
    assert list(failed) == [ids[1]] and "not finite" in failed[ids[1]]
    records = [engine.release(request_id) for request_id in ids]
    assert records[1].state == llmengine.RequestState.ABORTED
    assert len(records[1].output_token_ids) == 2  # the two tokens before the poisoned step
    assert records[1].output_token_ids == expected[1][:2]
    others = [record.output_token_ids for i, record in enumerate(records) if i != 1]
    assert others == [out for i, out in enumerate(expected) if i != 1]
    assert engine.num_free_blocks == engine.num_blocks
