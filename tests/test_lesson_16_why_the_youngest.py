"""Lesson 16's claims about the victim rule, recomputed on the scheduler over integers.

The lesson's workload: r0 (4-token prompt) and r1 (2-token prompt), budgets of 6, two slots, a
pool of 5 blocks of 2 positions. Expectations are worked out from that shape in the comments;
the loop is checked by running it further than the detector did, not by trusting the detector,
and the committed tables are read back to check they say what the package computes.
"""

from __future__ import annotations

import pytest
from report_tables import read_report_table

from llmengine.kv.blocks import blocks_for_length
from llmengine.lessons.victim_rules import (
    RESTART_RULES,
    RESUME_RULES,
    Config,
    EvictLargest,
    EvictLargestOfAll,
    SweepResult,
    make_requests,
    run_rule,
    scheduler_state,
    small_configs,
    sweep_rule,
)
from llmengine.scheduling.request import Request
from llmengine.scheduling.scheduler import Scheduler

BLOCK, POOL, SLOTS = 2, 5, 2
WORKLOAD = [(4, 6), (2, 6)]
BUDGET = 6
Sweeps = dict[tuple[str, str], SweepResult]


@pytest.fixture(scope="module")
def configs() -> list[Config]:
    return small_configs(
        num_requests=2, block_sizes=(1, 2), max_blocks=6, max_prompt=3, max_budget=5
    )


@pytest.fixture(scope="module")
def sweeps(configs: list[Config]) -> Sweeps:
    admitted = [config for config in configs if config.passes_the_door()]
    return {
        (victims, rule): sweep_rule(scheduler_class, admitted)
        for victims, rules in (("resume", RESUME_RULES), ("restart", RESTART_RULES))
        for rule, scheduler_class in rules.items()
    }


def test_three_rules_on_the_engine_as_built_all_drain() -> None:
    # Steps 1-3 run both rows. After step 3 r0 has 4 + 3 = 7 tokens, so its next decode
    # writes a 7th position and needs a 4th block of 2; r1 has 2 + 3 = 5 and needs a 3rd; they
    # hold 3 + 2 = 5 blocks, the whole pool. Step 4 is the one dry step: whoever is evicted
    # waits while the other finishes its 3 remaining tokens alone (steps 4-6), then resumes
    # alone for its own 3 (steps 7-9).
    for rule, scheduler_class in RESUME_RULES.items():
        trace = run_rule(scheduler_class, WORKLOAD, POOL, BLOCK, SLOTS)
        assert trace.drained and not trace.livelocked, rule
        assert len(trace.steps) == 9 and trace.tokens_kept == trace.tokens_sampled == 12
        (eviction,) = trace.evictions
        assert trace.steps[3].evicted == (eviction.victim,)
    youngest = run_rule(Scheduler, WORKLOAD, POOL, BLOCK, SLOTS)
    # r1 is evicted with 3 tokens kept and resumes over 2 + 3 positions; r0 never waits.
    assert youngest.evictions[0].victim == 1 and youngest.recomputed == 2 + 3
    assert youngest.finished_at == {0: BUDGET, 1: 9}
    # r0 asks, and is both the largest candidate (3 blocks to 2) and the oldest.
    for rule in ("largest", "oldest"):
        trace = run_rule(RESUME_RULES[rule], WORKLOAD, POOL, BLOCK, SLOTS)
        assert trace.evictions[0].victim == 0 and trace.recomputed == 4 + 3
        assert trace.finished_at == {1: BUDGET, 0: 9}


def test_nothing_loops_when_victims_resume(configs: list[Config], sweeps: Sweeps) -> None:
    admitted = [config for config in configs if config.passes_the_door()]
    for rule in RESUME_RULES:
        result = sweeps["resume", rule]
        assert result.configs == len(admitted) > 1000
        # Every step keeps a token, so no run takes more steps than its budgets have tokens.
        assert result.drained == result.within_token_bound == result.configs, rule
        assert result.livelocked == 0


def test_every_step_runs_a_row_when_victims_resume(configs: list[Config]) -> None:
    # Step 1 of the lesson's argument, checked directly on every run of the largest rule.
    for config in configs:
        if config.passes_the_door():
            trace = run_rule(
                EvictLargest, config.specs, config.num_blocks, config.block_size, SLOTS
            )
            assert all(step.rows for step in trace.steps), config


def test_restart_with_evict_the_largest_livelocks() -> None:
    trace = run_rule(RESTART_RULES["largest"], WORKLOAD, POOL, BLOCK, SLOTS)
    assert trace.livelocked and not trace.drained and trace.finished_at == {}
    assert trace.cycle_length == trace.repeated_at - trace.first_seen > 0
    # Independently of the detector: run the same scheduler three cycles further and find
    # the state again after each, with nobody finishing and tokens thrown away every cycle.
    scheduler = RESTART_RULES["largest"](num_blocks=POOL, block_size=BLOCK, num_slots=SLOTS)
    requests = make_requests(WORKLOAD, BLOCK)
    for request in requests:
        scheduler.add(request)
    states = []
    for _ in range(trace.first_seen + 3 * trace.cycle_length):
        out = scheduler.schedule()
        assert not scheduler.update(out, {row.request.request_id: 7 for row in out.rows})
        states.append(scheduler_state(scheduler, requests))
    sightings = states[trace.first_seen - 1 :: trace.cycle_length]
    assert len(sightings) == 4 and len(set(sightings)) == 1
    assert all(request.num_output_tokens < BUDGET for request in requests)
    # The committed table says the same.
    row = next(r for r in read_report_table("why-youngest-restart") if r["rule"] == "largest")
    assert row["state repeats (cycle)"] == (
        f"after steps {trace.first_seen} and {trace.repeated_at} ({trace.cycle_length})"
    )
    assert row["drained"] == "no" and row["r0 finishes at step"] == "never"


def test_the_loop_is_requests_taking_turns() -> None:
    trace = run_rule(RESTART_RULES["largest"], WORKLOAD, POOL, BLOCK, SLOTS)
    cycle = trace.steps[trace.first_seen : trace.repeated_at]
    assert {eviction.asker for step in cycle for eviction in step.evictions} == {0, 1}
    assert any(e.asker != e.victim for e in trace.evictions)
    # When r0 asks, it is first in the running list and both requests are candidates: the
    # victim is whoever held more blocks after the step before (ties cannot arise here).
    for previous, step in zip(trace.steps, trace.steps[1:], strict=False):
        for eviction in step.evictions:
            if eviction.asker == 0:
                assert previous.held[eviction.victim] > previous.held[1 - eviction.victim]


def test_evict_the_youngest_drains_even_when_victims_restart(sweeps: Sweeps) -> None:
    result = sweeps["restart", "youngest"]
    assert result.drained == result.configs and result.livelocked == 0
    assert sweeps["restart", "largest"].livelocked > 0
    trace = run_rule(RESTART_RULES["youngest"], WORKLOAD, POOL, BLOCK, SLOTS)
    # r0 is never a victim, so it runs every step and finishes at the step numbered its budget.
    assert trace.drained and trace.evictions_of(0) == 0 and trace.finished_at[0] == BUDGET
    # Restart throws tokens away: more sampled than kept.
    assert trace.tokens_kept == 12 < trace.tokens_sampled


def test_the_oldest_is_never_a_victim_under_the_youngest_rule(sweeps: Sweeps) -> None:
    for victims in ("resume", "restart"):
        assert sweeps[victims, "youngest"].oldest_evicted == 0
        assert sweeps[victims, "largest"].oldest_evicted > 0
        assert sweeps[victims, "oldest"].oldest_evicted > sweeps[victims, "largest"].oldest_evicted
    table = {row["rule"]: row for row in read_report_table("why-youngest-sweep-restart")}
    for rule in RESTART_RULES:
        assert int(table[rule]["state repeated"]) == sweeps["restart", rule].livelocked
        assert int(table[rule]["r0 ever a victim"]) == sweeps["restart", rule].oldest_evicted


def test_arrivals_a_step_apart_loop_evict_the_oldest_too() -> None:
    lengths = [2, 4, 8, 16]

    def first_finish(rule: type[Scheduler], length: int) -> int | None:
        stream = [WORKLOAD[0]] + [WORKLOAD[1]] * (length - 1)
        trace = run_rule(rule, stream, POOL, BLOCK, SLOTS, arrive_at=range(length))
        return trace.finished_at.get(0)

    # Nobody who arrives later can take r0's blocks under the youngest rule, whatever restart
    # throws away; the two other rules loop with restart as soon as one request follows.
    for victims in (RESUME_RULES, RESTART_RULES):
        assert [first_finish(victims["youngest"], n) for n in lengths] == [BUDGET] * 4
    for rule in ("largest", "oldest"):
        assert [first_finish(RESTART_RULES[rule], n) for n in lengths] == [None] * 4
        # With resume every readmission keeps a token: r0 is late, by the same bounded amount.
        resumed = [first_finish(RESUME_RULES[rule], n) for n in lengths]
        assert len(set(resumed)) == 1 and resumed[0] > BUDGET
    table = read_report_table("why-youngest-stream")
    assert [row["16 requests"] for row in table if row["victims"] == "restart"] == [
        str(BUDGET),
        "never (loops)",
        "never (loops)",
    ]


def test_only_requests_behind_the_asker_are_candidates() -> None:
    # One more block: at step 4 r0 takes the last free block for its row, then r1 needs one.
    unrestricted = run_rule(EvictLargestOfAll, WORKLOAD, POOL + 1, BLOCK, SLOTS)
    last = unrestricted.steps[-1]
    assert last.number == 4 and last.orphan_rows == (0,) and 0 in last.rows
    restricted = run_rule(EvictLargest, WORKLOAD, POOL + 1, BLOCK, SLOTS)
    assert restricted.drained
    assert not any(step.orphan_rows for step in restricted.steps)


def test_the_door_check_is_the_other_half(configs: list[Config], sweeps: Sweeps) -> None:
    for key, result in sweeps.items():
        assert result.lone_self_evictions == 0, key
    # Past the door: a worst case two positions over the pool evicts r1, then itself, then
    # never fits again, and r1 waits behind it forever.
    stalled = run_rule(Scheduler, [(4, 8), WORKLOAD[1]], POOL, BLOCK, SLOTS, door=False)
    assert stalled.livelocked and stalled.lone_self_evictions == 1 and stalled.evictions_of(1) == 1
    assert stalled.cycle_length == 1 and stalled.finished_at == {}
    blocked = run_rule(Scheduler, [(11, 1), WORKLOAD[1]], POOL, BLOCK, SLOTS, door=False)
    assert blocked.first_seen == 0 and blocked.repeated_at == 1 and not blocked.steps[0].rows
    # The door refuses exactly what blocks_for_length(worst case) > num_blocks says.
    for prompt, budget in [(4, 6), (4, 7), (4, 8), (11, 1)]:
        (request,) = make_requests([(prompt, budget)], BLOCK)
        fits = blocks_for_length(prompt + budget, BLOCK) <= POOL
        assert _door_admits(request) == fits


def test_the_door_is_one_position_stricter_than_the_proof(configs: list[Config]) -> None:
    refused = [config for config in configs if not config.passes_the_door()]
    drains = [
        config
        for config in refused
        if run_rule(
            Scheduler, config.specs, config.num_blocks, config.block_size, SLOTS, door=False
        ).drained
    ]
    # A request writes at most prompt + budget - 1 positions: its last token is never written.
    writes_fit = [
        config
        for config in refused
        if all(
            blocks_for_length(p + b - 1, config.block_size) <= config.num_blocks
            for p, b in config.specs
        )
    ]
    assert drains == writes_fit and drains
    row = read_report_table("why-youngest-door-sweep")[-1]
    assert int(row["drained"]) == len(drains) and int(row["workloads"]) == len(refused)


def _door_admits(request: Request) -> bool:
    try:
        Scheduler(num_blocks=POOL, block_size=BLOCK, num_slots=SLOTS).add(request)
    except ValueError:
        return False
    return True
