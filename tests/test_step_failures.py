"""A step whose logits for some rows are not finite fails those requests alone: they get no
token and are aborted, every other row goes on with exactly the tokens it would have had,
and the pool stays whole. So does a fault traced to one request's sampling, its grammar or
its drafts: only a fault of unknown owner (the forward) fails the step."""

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


def step_to_the_end(engine: Engine) -> dict[int, str]:
    """Step until nothing is unfinished, checking the pool after every step and that no
    request both got a token and failed; every failure, with why."""
    failed: dict[int, str] = {}
    while engine.has_unfinished():
        outcome = engine.step()
        engine.check_integrity()
        assert not set(outcome.failed) & set(outcome.tokens)
        failed.update(outcome.failed)
    return failed


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_logits_fail_only_their_request(model, monkeypatch, value) -> None:
    expected = Engine(model, num_blocks=32, num_slots=4).generate(PROMPTS, PARAMS)
    engine = Engine(model, num_blocks=32, num_slots=4)
    ids = engine.add_requests(PROMPTS, [PARAMS] * len(PROMPTS))
    # Step 3 is a decode of all four rows; row 1 is request ids[1].
    monkeypatch.setattr(runner_module, "paged_forward", poisoned_forward(3, 1, value))
    failed = step_to_the_end(engine)
    assert list(failed) == [ids[1]] and "not finite" in failed[ids[1]]
    records = [engine.release(request_id) for request_id in ids]
    assert records[1].state == llmengine.RequestState.ABORTED
    assert len(records[1].output_token_ids) == 2  # the two tokens before the poisoned step
    assert records[1].output_token_ids == expected[1][:2]
    others = [record.output_token_ids for i, record in enumerate(records) if i != 1]
    assert others == [out for i, out in enumerate(expected) if i != 1]
    assert engine.num_free_blocks == engine.num_blocks


# Six requests: greedy, seeded and penalised side by side. The last is penalised (so its draw
# calls `apply_penalties`) and its prompt starts with a token no other's has: poisoned, it
# raises after the seeded rows before it in the batch have drawn.
POISON = 61
SIX_PROMPTS = [[2, 7], [3, 4, 8, 6], [11, 12], [13, 1, 1], [9, 9, 9, 2], [POISON, 5, 9]]
SIX_PARAMS = [
    llmengine.SamplingParams(max_tokens=9, ignore_eos=True),
    llmengine.SamplingParams(max_tokens=9, temperature=0.9, seed=3, ignore_eos=True),
    llmengine.SamplingParams(max_tokens=9, presence_penalty=0.5, ignore_eos=True),
    llmengine.SamplingParams(max_tokens=9, temperature=1.1, top_k=20, seed=8, ignore_eos=True),
    llmengine.SamplingParams(max_tokens=9, temperature=0.7, repetition_penalty=1.1, seed=1,
                             ignore_eos=True),
    llmengine.SamplingParams(max_tokens=9, repetition_penalty=1.2, ignore_eos=True),
]  # fmt: skip


def run_six(engine: Engine) -> tuple[list[list[int]], dict[int, str]]:
    ids = engine.add_requests(SIX_PROMPTS, SIX_PARAMS)
    failed = step_to_the_end(engine)
    return [engine.release(request_id).output_token_ids for request_id in ids], failed


def test_a_sampling_fault_fails_its_request_alone(model, monkeypatch) -> None:
    """`apply_penalties` raises for one request at its third token: the batch's draw fails,
    every seeded generator goes back to where it stood, the rows are drawn one by one, and
    only the poisoned request fails; the five others get exactly a clean run's tokens."""
    expected, clean_failures = run_six(Engine(model, num_blocks=48, num_slots=6))
    assert clean_failures == {}
    real = llmengine.sampling.apply_penalties

    def poisoned(logits, params, history):  # noqa: ANN001, ANN202
        tokens, prompt_length = history
        if tokens[0] == POISON and len(tokens) - prompt_length == 2:
            raise RuntimeError("poisoned")
        return real(logits, params, history)

    monkeypatch.setattr(llmengine.sampling, "apply_penalties", poisoned)
    engine = Engine(model, num_blocks=48, num_slots=6)
    outputs, failed = run_six(engine)
    assert list(failed) == [5] and "sampling failed: poisoned" in failed[5]
    assert outputs[5] == expected[5][:2]
    assert outputs[:5] == expected[:5]
    assert engine.num_free_blocks == engine.num_blocks


class BrokenMatcher:
    """A grammar matcher that fails in one of the two ways a real one can inside a step."""

    def __init__(self, when: str) -> None:
        self.when = when
        self.refused = False

    def unsafe_compute_mask_ptr(self, pointer: int, size: int) -> None:
        if self.when == "mask":
            raise RuntimeError("Current row has 5001 items; max is 2000")

    def consume_token(self, token: int) -> bool:
        self.refused = self.when == "accept"
        return not self.refused

    def is_error(self) -> bool:  # as llguidance's: a refused token leaves it in error
        return self.refused

    def get_error(self) -> str:
        return "refused"


@pytest.mark.parametrize("when", ["mask", "accept"])
def test_a_grammar_that_fails_inside_the_step_fails_alone(model, tokenizer, when) -> None:
    """One constrained request's matcher raises while its mask is computed, or refuses the
    token its own mask allowed: that request fails with no token (no text its grammar
    refuses ever leaves the engine), and the five others keep a clean run's tokens."""
    constrained = llmengine.SamplingParams(
        max_tokens=9, constraint=llmengine.Constraint.regex("[a-z ]+")
    )
    params = [*SIX_PARAMS[:5], constrained]
    expected = Engine(model, num_blocks=48, num_slots=6, tokenizer=tokenizer).generate(
        SIX_PROMPTS, params
    )
    engine = Engine(model, num_blocks=48, num_slots=6, tokenizer=tokenizer)
    ids = engine.add_requests(SIX_PROMPTS, params)
    first = engine.step()
    assert ids[5] in first.tokens
    engine.runner.sampler.grammars._matchers[ids[5]] = BrokenMatcher(when)
    second = engine.step()
    assert list(second.failed) == [ids[5]] and ids[5] not in second.tokens
    reason = "the grammar failed" if when == "mask" else "keeping token"
    assert reason in second.failed[ids[5]]
    while engine.has_unfinished():
        engine.step()
    outputs = [engine.release(request_id).output_token_ids for request_id in ids]
    assert outputs[5] == expected[5][:1]
    assert outputs[:5] == expected[:5]


def test_a_failed_forward_leaves_no_cached_block_without_its_k_v(model, monkeypatch) -> None:
    """The forward of a prefill raises: the full blocks the decision offered to the prefix
    cache never got their K/V. Once the request is aborted, the same prompt finds none of
    them and gets a clean engine's tokens."""
    prompt = list(range(1, 14))  # three full blocks of 4, and a fourth begun
    params = llmengine.SamplingParams(max_tokens=6, ignore_eos=True)
    pool = {"num_blocks": 16, "block_size": 4, "enable_prefix_caching": True}
    expected = Engine(model, **pool).generate([prompt], params)
    engine = Engine(model, **pool)
    request_id = engine.add_request(prompt, params)

    def failing(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("the forward failed")

    with monkeypatch.context() as patch:
        patch.setattr(runner_module, "paged_forward", failing)
        with pytest.raises(RuntimeError, match="the forward failed"):
            engine.step()
    engine.abort(request_id)
    engine.check_integrity()
    again = engine.add_request(prompt, params)
    first = engine.step()
    assert first.cached_tokens == 0
    while engine.has_unfinished():
        engine.step()
    assert engine.release(again).output_token_ids == expected[0]
    assert engine.num_free_blocks == engine.num_blocks
