"""The model runner on its own: a scheduler's decisions in, `StepResult`s out, the same tokens
the engine gives; what it keeps for a request it lets go of when a decision says so; and a
follower runner given the leader's plans computes the leader's logits."""

from __future__ import annotations

import torch

import llmengine
from llmengine.engine_config import EngineConfig
from llmengine.outcome import EAGER
from llmengine.runner import ModelRunner, StepResult
from llmengine.runner.prepare import ForwardPlan, Inputs
from llmengine.scheduling.request import Request
from llmengine.scheduling.scheduler import Scheduler

PROMPTS = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10, 11]]
CONFIG = EngineConfig(num_blocks=16, block_size=4, num_slots=2)


def requests(params: list[llmengine.SamplingParams], eos: tuple[int, ...]) -> list[Request]:
    return [
        Request(
            request_id=index,
            prompt_token_ids=prompt,
            params=params[index],
            arrival=index,
            block_size=CONFIG.block_size,
            eos_token_ids=eos,
        )  # fmt: skip
        for index, prompt in enumerate(PROMPTS)
    ]


def test_a_scheduler_and_a_runner_make_the_engines_tokens(model: llmengine.Llama) -> None:
    """Three requests through two slots (one waits), one of them seeded: the loop an engine
    runs, written out, gives the engine's tokens; the runner holds nothing once all are
    done and a last decision has named them."""
    params = [
        llmengine.SamplingParams(max_tokens=6, ignore_eos=True),
        llmengine.SamplingParams(max_tokens=5, temperature=0.9, seed=4, ignore_eos=True),
        llmengine.SamplingParams(max_tokens=7, ignore_eos=True),
    ]
    expected = llmengine.Engine(model, CONFIG).generate(PROMPTS, params)
    scheduler, runner = Scheduler(CONFIG), ModelRunner(model, CONFIG)
    made = requests(params, model.config.eos_token_ids)
    for request in made:
        scheduler.add(request)
    results: list[StepResult] = []
    while scheduler.has_unfinished():
        decision = scheduler.schedule()
        results.append(runner.run(decision))
        scheduler.update(decision, results[-1].tokens)
    assert [request.output_token_ids for request in made] == expected
    assert results[0].forward == "eager" and not any(result.failed for result in results)
    assert set(runner.sampler.generators) == {2}  # the last one's decision has not come yet
    runner.run(scheduler.schedule())  # an empty decision naming the requests just done
    assert runner.sampler.generators == {}


def test_a_follower_runs_the_leaders_plans_to_the_same_logits(model: llmengine.Llama) -> None:
    """What a tensor-parallel rank does with rank 0's plans, in one process: a runner built
    with `leader=False` on the same model, given each plan the leader ran, writes the same
    K/V and returns the same logits."""
    config = EngineConfig(num_blocks=16, block_size=4, num_slots=3)
    leader, follower = ModelRunner(model, config), ModelRunner(model, config, leader=False)
    plans: list[tuple[ForwardPlan, torch.Tensor]] = []
    execute = leader.execute

    def recording(plan: ForwardPlan, inputs: Inputs | None = None) -> torch.Tensor:
        logits = execute(plan, inputs)
        plans.append((plan, logits.clone()))
        return logits

    leader.execute = recording  # type: ignore[method-assign]
    scheduler = Scheduler(config)
    greedy = [llmengine.SamplingParams(max_tokens=4, ignore_eos=True)] * len(PROMPTS)
    for request in requests(greedy, ()):
        scheduler.add(request)
    while scheduler.has_unfinished():
        decision = scheduler.schedule()
        scheduler.update(decision, leader.run(decision).tokens)
    assert plans[0][0].path == EAGER and len(plans) > 3
    with torch.inference_mode():
        for plan, logits in plans:
            torch.testing.assert_close(follower.execute(plan), logits)
    for mine, theirs in zip(follower.cache.keys, leader.cache.keys, strict=True):
        torch.testing.assert_close(mine, theirs)
