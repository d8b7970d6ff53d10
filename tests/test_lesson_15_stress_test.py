"""Lesson 15, the stress test: its claims recomputed with the package, on the shipped model.

The stress run is the lesson's own (48 requests, 6 slots, 12 blocks, the same abort script),
and its committed summary must describe it. The wrong resumes are checked on the first twelve
requests of the same workload, which evict often enough to show each rule's fingerprint.
Every edge case of the lesson's table is a test here, run on the engine directly.
"""

from __future__ import annotations

from collections import Counter

import pytest
from report_tables import read_report_table

import llmengine
from llmengine.bench.workloads import RequestSpec
from llmengine.engine import Engine
from llmengine.lessons.stress import (
    ScriptedAbort,
    StressRun,
    first_divergence,
    lifecycle_state,
    pool_for_everyone,
    run_stress,
)
from llmengine.lessons.wrong_resumes import PromptOnlyEngine, RestartEngine
from llmengine.outcome import IterationOutcome
from llmengine.sampling import SamplingParams
from llmengine.scheduling.request import RequestState

BLOCK, SLOTS, POOL = 4, 6, 12
SPEAKERS = ["ROMEO", "JULIET", "HAMLET", "KING LEAR", "MACBETH", "PORTIA"]
SPEAKERS += ["OTHELLO", "PROSPERO", "BRUTUS", "ANTONY", "HENRY V", "ORSINO"]
OPENINGS = ["O", "What", "I", "My"]
SCRIPT = [
    ScriptedAbort(10, "waiting"),
    ScriptedAbort(50, "running"),
    ScriptedAbort(100, "preempted"),
    ScriptedAbort(150, "waiting"),
    ScriptedAbort(250, "running"),
    ScriptedAbort(350, "preempted"),
]
EDGE_POOL = 8


def params_for(index: int) -> SamplingParams:
    """The lesson's rule: budgets cycle through 16..32, every third request sampled and seeded."""
    budget = 16 + 7 * index % 17
    if index % 3:
        return SamplingParams(max_tokens=budget, ignore_eos=True)
    return SamplingParams(max_tokens=budget, temperature=0.8, seed=index, ignore_eos=True)


@pytest.fixture(scope="module")
def workload() -> list[RequestSpec]:
    tokenizer = llmengine.load_tokenizer()
    prompts = [tokenizer.encode(f"{s}:\n{o}") for o in OPENINGS for s in SPEAKERS]
    return [RequestSpec(tuple(prompt), params_for(i)) for i, prompt in enumerate(prompts)]


@pytest.fixture(scope="module")
def reference(model: llmengine.Llama, workload: list[RequestSpec]) -> list[list[int]]:
    roomy = run_stress(
        model,
        workload,
        num_blocks=pool_for_everyone(workload, BLOCK),
        block_size=BLOCK,
        num_slots=len(workload),
    )
    assert roomy.num_evictions == 0
    return roomy.outputs


@pytest.fixture(scope="module")
def stress(model: llmengine.Llama, workload: list[RequestSpec]) -> StressRun:
    return run_stress(model, workload, SCRIPT, num_blocks=POOL, block_size=BLOCK, num_slots=SLOTS)


def cramped(model: llmengine.Llama, workload: list[RequestSpec], engine_class: type[Engine]):
    return run_stress(
        model,
        workload[:12],
        engine_class=engine_class,
        num_blocks=POOL,
        block_size=BLOCK,
        num_slots=SLOTS,
    )


def sampled(workload: list[RequestSpec]) -> set[int]:
    return {index for index, spec in enumerate(workload) if not spec.params.greedy}


def alone(model: llmengine.Llama, prompt: list[int], params: SamplingParams) -> list[int]:
    return Engine(model, num_blocks=64, block_size=BLOCK).generate([prompt], params)[0]


# -- the stress run ----------------------------------------------------------------------


def test_stress_run_evicts_requests_again_and_again(stress: StressRun) -> None:
    assert max(stress.evictions) >= 3
    assert sum(count >= 2 for count in stress.evictions) > len(stress.request_ids) // 2
    # Every eviction of a request that was not aborted while queued is followed by its resume.
    preempted_aborts = sum(record.state == "preempted" for record in stress.aborts)
    assert stress.num_evictions - stress.num_resumes == preempted_aborts


def test_stress_run_aborts_in_every_state(stress: StressRun) -> None:
    assert Counter(record.state for record in stress.aborts) == {
        "waiting": 2,
        "running": 2,
        "preempted": 2,
    }
    for record in stress.aborts:
        request = stress.engine.request(stress.request_ids[record.index])
        assert request.state is RequestState.ABORTED
        if record.state == "waiting":  # never admitted: no tokens, never evicted
            assert record.tokens_generated == 0 and request.num_preemptions == 0
        else:
            assert record.tokens_generated > 0
        if record.state == "preempted":
            assert request.num_preemptions > 0


def test_stress_run_keeps_the_roomy_text(stress: StressRun, reference: list[list[int]]) -> None:
    assert len(stress.survivors) == len(stress.request_ids) - len(SCRIPT)
    assert stress.differing(reference) == []
    assert stress.aborted_prefixes_hold(reference)
    assert stress.streamed == stress.outputs


def test_stress_run_gives_every_block_and_slot_back(stress: StressRun) -> None:
    engine = stress.engine
    assert not engine.has_unfinished()
    assert stress.blocks_back and engine.num_free_blocks == POOL
    assert stress.slots_back
    engine.check_integrity()
    assert all(snapshot.held_blocks <= POOL for snapshot in stress.snapshots)
    assert stress.snapshots[-1].free_blocks == POOL


def test_stress_summary_table_is_this_run(stress: StressRun) -> None:
    table = {row["stress test"]: row["result"] for row in read_report_table("stress-summary")}
    survivors = len(stress.survivors)
    assert table["requests"] == str(len(stress.request_ids))
    assert table["steps"] == str(stress.num_steps)
    assert table["evictions"] == str(stress.num_evictions)
    assert table["requests evicted at least twice"] == str(sum(n >= 2 for n in stress.evictions))
    assert table["most evictions of one request"] == str(max(stress.evictions))
    assert table["resumes"] == str(stress.num_resumes)
    assert table["aborted waiting / running / preempted"] == "2 / 2 / 2"
    assert table["survivors with the roomy text"] == f"{survivors} of {survivors}"
    assert table["integrity checks passed"] == str(stress.num_steps + len(SCRIPT))
    assert table["blocks back at the end"] == f"{POOL} of {POOL}"
    assert table["slots back at the end"] == "yes"


def test_run_stress_stops_at_the_step_that_breaks_the_books(
    model: llmengine.Llama, workload: list[RequestSpec]
) -> None:
    class Leaking(Engine):
        """Takes a block from the pool behind the scheduler's back on its third step."""

        def step(self) -> IterationOutcome:
            outcome = super().step()
            if self.iteration == 3:
                self.scheduler.pool.allocate(1)
            return outcome

    with pytest.raises(AssertionError, match="block tables and the pool disagree"):
        run_stress(
            model, workload[:4], engine_class=Leaking, num_blocks=64, block_size=BLOCK, num_slots=4
        )


def test_an_abort_whose_state_never_comes_is_an_error(
    model: llmengine.Llama, workload: list[RequestSpec]
) -> None:
    with pytest.raises(RuntimeError, match="preempted from step 1"):
        run_stress(
            model,
            workload[:2],
            [ScriptedAbort(1, "preempted")],
            num_blocks=64,
            block_size=BLOCK,
            num_slots=2,
        )
    with pytest.raises(ValueError, match="one burst"):
        run_stress(model, [RequestSpec((1, 2), SamplingParams(), arrival=3.0)], num_blocks=8)


def test_lifecycle_state_tells_a_preempted_request_from_a_fresh_one(
    model: llmengine.Llama,
) -> None:
    engine = Engine(model, num_blocks=EDGE_POOL, block_size=BLOCK, num_slots=2)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    older, younger, queued = (engine.add_request([0, 5, 6, 7, 8], params) for _ in range(3))
    assert [lifecycle_state(engine.request(i)) for i in (older, younger, queued)] == ["waiting"] * 3
    while engine.request(younger).num_preemptions == 0:
        engine.step()
    states = [lifecycle_state(engine.request(i)) for i in (older, younger, queued)]
    assert states == ["running", "preempted", "waiting"]


def test_first_divergence() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 2, 3], [1, 2, 3, 4]) == 2
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert first_divergence([], [7]) == 0


# -- the two wrong resumes ---------------------------------------------------------------


def test_restart_keeps_counts_and_greedy_text_but_changes_sampled_text(
    model: llmengine.Llama, workload: list[RequestSpec], reference: list[list[int]]
) -> None:
    run = cramped(model, workload, RestartEngine)
    assert run.blocks_back and run.slots_back
    evicted = {i for i, count in enumerate(run.evictions) if count}
    assert evicted & sampled(workload) and evicted - sampled(workload)
    assert [len(tokens) for tokens in run.outputs] == [len(tokens) for tokens in reference[:12]]
    # Greedy requests rebuild the same text; every evicted sampled one draws new tokens.
    assert set(run.differing(reference)) == evicted & sampled(workload)
    # The steps streamed the thrown-away tokens too, so the stream outgrows the record.
    assert sum(map(len, run.streamed)) > sum(map(len, run.outputs))


def test_prompt_only_repeats_the_first_token_at_every_greedy_resume(
    model: llmengine.Llama, workload: list[RequestSpec], reference: list[list[int]]
) -> None:
    run = cramped(model, workload, PromptOnlyEngine)
    assert run.blocks_back and run.slots_back
    assert [len(tokens) for tokens in run.outputs] == [len(tokens) for tokens in reference[:12]]
    evicted = {i for i, count in enumerate(run.evictions) if count}
    assert set(run.differing(reference)) == evicted
    # A greedy request sampled from its prompt alone says its first token again.
    greedy_resumes = [
        (outcome.tokens[request_id], run.outputs[index][0])
        for outcome in run.outcomes
        for request_id in outcome.resumed
        if (index := run.request_ids.index(request_id)) not in sampled(workload)
    ]
    assert len(greedy_resumes) > 5
    assert all(token == first for token, first in greedy_resumes)


def test_wrong_resume_table_says_which_rule_keeps_the_text() -> None:
    rows = {row["resume rule"]: row for row in read_report_table("stress-wrong-resumes")}
    assert set(rows) == {"resume (the engine)", "restart", "prompt only"}
    for row in rows.values():
        assert row["drains, blocks and slots back"] == "yes"
        assert row["same token counts"] == "yes"
    assert rows["resume (the engine)"]["same text"] == "yes"
    assert rows["restart"]["same text"] == rows["prompt only"]["same text"] == "no"
    assert rows["restart"]["other text: greedy / sampled"].startswith("0 / ")
    streamed, recorded = map(int, rows["restart"]["tokens streamed / recorded"].split(" / "))
    assert streamed > recorded


# -- edge cases --------------------------------------------------------------------------


def edge_engine(model: llmengine.Llama) -> Engine:
    return Engine(model, num_blocks=EDGE_POOL, block_size=BLOCK, num_slots=2)


def run_to_end(engine: Engine) -> list:
    outcomes = []
    while engine.has_unfinished():
        outcomes.append(engine.step())
        engine.check_integrity()
    return outcomes


def test_prompt_that_exactly_fills_a_block(model: llmengine.Llama) -> None:
    prompt = list(range(2, 2 + 2 * BLOCK))
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    engine = edge_engine(model)
    rid = engine.add_request(prompt, params)
    held = [outcome.held_blocks for outcome in run_to_end(engine)]
    assert held[:2] == [2, 3]  # the prefill fills two blocks; position 8 opens the third
    assert engine.request(rid).output_token_ids == alone(model, prompt, params)


def test_max_tokens_one_finishes_in_the_step_that_admits_it(model: llmengine.Llama) -> None:
    engine = edge_engine(model)
    rid = engine.add_request([0, 5, 6, 7, 8], SamplingParams(max_tokens=1))
    first = engine.step()
    assert first.admitted == first.finished == [rid]
    assert engine.request(rid).finish_reason == "length"
    assert engine.num_free_blocks == EDGE_POOL and not engine.has_unfinished()


def test_end_token_as_the_first_token(model: llmengine.Llama) -> None:
    prompt = [0, 5, 6, 7, 8]
    first_token = alone(model, prompt, SamplingParams(max_tokens=1))[0]
    engine = edge_engine(model)
    engine.eos_token_ids = (first_token,)
    rid = engine.add_request(prompt, SamplingParams(max_tokens=16))
    assert len(run_to_end(engine)) == 1
    request = engine.request(rid)
    assert (request.output_token_ids, request.finish_reason) == ([first_token], "eos")
    assert engine.num_free_blocks == EDGE_POOL


def test_worst_case_equal_to_the_pool_is_admitted_and_ends_alone(model: llmengine.Llama) -> None:
    prompt = [0, 5, 6, 7, 8]
    fits = SamplingParams(max_tokens=EDGE_POOL * BLOCK - len(prompt), ignore_eos=True)
    younger = SamplingParams(max_tokens=16, ignore_eos=True)
    engine = edge_engine(model)
    big, small = engine.add_request(prompt, fits), engine.add_request(prompt, younger)
    outcomes = run_to_end(engine)
    last = next(outcome for outcome in outcomes if big in outcome.finished)
    assert (last.rows, last.held_blocks) == (1, EDGE_POOL)
    assert engine.request(small).num_preemptions >= 1
    assert engine.request(big).output_token_ids == alone(model, prompt, fits)
    assert engine.request(small).output_token_ids == alone(model, prompt, younger)


def test_one_token_over_the_pool_is_refused_at_the_door(model: llmengine.Llama) -> None:
    prompt = [0, 5, 6, 7, 8]
    over = SamplingParams(max_tokens=EDGE_POOL * BLOCK - len(prompt) + 1, ignore_eos=True)
    engine = edge_engine(model)
    with pytest.raises(ValueError, match=f"needs up to {EDGE_POOL + 1} blocks"):
        engine.add_request(prompt, over)
    assert not engine.has_unfinished() and engine.num_free_blocks == EDGE_POOL


def test_abort_of_a_preempted_request(model: llmengine.Llama) -> None:
    prompt = [0, 5, 6, 7, 8]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    engine = edge_engine(model)
    older, victim = engine.add_request(prompt, params), engine.add_request(prompt, params)
    while lifecycle_state(engine.request(victim)) != "preempted":
        engine.step()
    free_before = engine.num_free_blocks
    assert engine.abort(victim) is True
    engine.check_integrity()
    assert engine.num_free_blocks == free_before  # its blocks went back at the eviction
    assert engine.request(victim).state is RequestState.ABORTED
    run_to_end(engine)
    assert engine.request(older).output_token_ids == alone(model, prompt, params)
    assert engine.num_free_blocks == EDGE_POOL


def test_abort_of_a_finished_request_is_false(model: llmengine.Llama) -> None:
    engine = edge_engine(model)
    rid = engine.add_request([0, 5, 6, 7, 8], SamplingParams(max_tokens=3, ignore_eos=True))
    run_to_end(engine)
    kept = engine.request(rid).output_token_ids
    assert engine.abort(rid) is False
    assert engine.request(rid).state is RequestState.FINISHED
    assert engine.request(rid).output_token_ids == kept


def test_edge_case_table_holds_in_every_row() -> None:
    rows = read_report_table("stress-edge-cases")
    assert len(rows) == 7
    assert [row["holds?"] for row in rows] == ["yes"] * 7
