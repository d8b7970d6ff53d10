"""Lesson 22, chunked prefill: its deterministic tables recomputed, and the readings it uses.

The lesson's workload (four short requests decoding, a 384-token prompt arriving after 16
forwards) runs through the engine on the embedded model under each budget of the committed
tables; every cell is recomputed from the run's outcomes. The readings themselves are checked
on runs small enough to count by hand.
"""

from __future__ import annotations

import math

import pytest
from report_tables import read_report_table

import llmengine
from llmengine.bench.batchbench import WorkloadRun
from llmengine.bench.http_client import HttpRun, RequestRecord
from llmengine.bench.timing import Arrival
from llmengine.lessons.chunked_prefill import (
    describe_chunks,
    engine_stall_summary,
    first_token_iteration,
    http_stall_summary,
    kv_positions_gathered,
    long_prompt_arrives,
    padded_attention_scores,
    prefill_attention_scores,
    prefill_chunks,
    prefill_steps,
    stall_summary,
    token_times,
)
from llmengine.outcome import IterationOutcome

BLOCK_SIZE, NUM_BLOCKS, NUM_SLOTS = 16, 64, 8
ARRIVAL, LONG = 16, 4


def budget_of(cell: str) -> int | None:
    return None if cell == "none" else int(cell)


def number(cell: str) -> int:
    """A table's integer, thousands separators and all."""
    return int(cell.replace(",", ""))


def run_with(model: llmengine.Llama, budget: int | None, workload) -> WorkloadRun:
    engine = llmengine.Engine(
        model,
        num_blocks=NUM_BLOCKS,
        block_size=BLOCK_SIZE,
        num_slots=NUM_SLOTS,
        max_num_batched_tokens=budget,
    )
    return llmengine.run_workload(engine, workload)


@pytest.fixture(scope="module")
def steps_rows() -> list[dict[str, str]]:
    return read_report_table("chunked-prefill-steps")


@pytest.fixture(scope="module")
def runs(model: llmengine.Llama, steps_rows) -> dict[int | None, WorkloadRun]:
    workload = long_prompt_arrives(model.config.vocab_size, ARRIVAL)
    return {
        budget_of(row["max_num_batched_tokens"]): run_with(
            model, budget_of(row["max_num_batched_tokens"]), workload
        )
        for row in steps_rows
    }


# -- the lesson's tables -------------------------------------------------------------------


def test_the_steps_table_is_what_the_engine_does_under_each_budget(steps_rows, runs) -> None:
    assert [row["max_num_batched_tokens"] for row in steps_rows] == ["none", "32", "64", "128"]
    reference = runs[None].outputs
    for row in steps_rows:
        budget = budget_of(row["max_num_batched_tokens"])
        run = runs[budget]
        timing = run.timing()
        assert timing.preemptions == 0
        short_done = max(timing.latencies_iterations[run.request_ids[i]] for i in range(LONG))
        assert int(row["steps"]) == timing.iterations
        assert row["long prompt's chunks"] == describe_chunks(prefill_chunks(run, LONG))
        assert int(row["its first token at iteration"]) == first_token_iteration(run, LONG)
        assert int(row["most positions in one step"]) == max(timing.forward_tokens)
        assert int(row["short requests done at iteration"]) == short_done
        assert int(row["positions computed"]) == timing.total_forward_tokens
        assert row["same text"] == ("yes" if run.outputs == reference else "no")


def test_every_budget_caps_every_step_and_keeps_the_text(model, steps_rows, runs) -> None:
    """The table's claims as claims: the cap holds, the text and the work are the same, the
    long prompt is chunked and its first token comes later the smaller the budget."""
    assert all(row["same text"] == "yes" for row in steps_rows)
    unbudgeted = runs[None]
    workload = long_prompt_arrives(model.config.vocab_size, ARRIVAL)
    prompt = len(workload[LONG].prompt_token_ids)
    assert max(unbudgeted.timing().forward_tokens) == prompt + LONG
    first_tokens = []
    for budget, run in runs.items():
        assert run.outputs == unbudgeted.outputs
        assert run.timing().total_forward_tokens == unbudgeted.timing().total_forward_tokens
        assert sum(prefill_chunks(run, LONG)) == prompt
        if budget is not None:
            assert max(run.timing().forward_tokens) <= budget
            assert len(prefill_chunks(run, LONG)) > 1
            first_tokens.append((budget, first_token_iteration(run, LONG)))
    by_budget = [iteration for _, iteration in sorted(first_tokens)]
    assert by_budget == sorted(by_budget, reverse=True)
    assert first_token_iteration(unbudgeted, LONG) == ARRIVAL + 1
    assert min(by_budget) > ARRIVAL + 1


def test_the_long_prompt_table_counts_its_chunks_reads_and_scores(model, runs) -> None:
    rows = read_report_table("chunked-prefill-long-prompt")
    alone = long_prompt_arrives(model.config.vocab_size, 0.0)[LONG:]
    assert [budget_of(row["max_num_batched_tokens"]) for row in rows] == list(runs)
    for row in rows:
        budget = budget_of(row["max_num_batched_tokens"])
        run, alone_run = runs[budget], run_with(model, budget, alone)
        chunks = prefill_chunks(run, LONG)
        assert number(row["chunks"]) == len(chunks)
        assert number(row["K/V positions its chunks read"]) == kv_positions_gathered(chunks)
        assert number(row["attention scores of its steps, beside the decodes"]) == (
            prefill_attention_scores(run, LONG)
        )
        assert number(row["chunks, alone"]) == len(prefill_chunks(alone_run, 0))
        assert number(row["attention scores of its steps, alone"]) == (
            prefill_attention_scores(alone_run, 0)
        )
        if budget is not None:
            assert number(row["chunks, alone"]) == math.ceil(
                len(alone[0].prompt_token_ids) / budget
            )


# -- the readings, on runs counted by hand --------------------------------------------------


def outcome(number: int, rows: dict[int, int], tokens: tuple[int, ...] = ()) -> IterationOutcome:
    return IterationOutcome(
        iteration=number,
        tokens={request_id: 7 for request_id in tokens},
        row_positions=rows,
        rows=len(rows),
        forward_tokens=sum(rows.values()),
    )


def hand_run() -> WorkloadRun:
    """Request 0 decodes from a 2-token prompt; request 1's 5-token prompt comes in 3 + 2."""
    outcomes = [
        outcome(0, {0: 2}, tokens=(0,)),
        outcome(1, {0: 1, 1: 3}, tokens=(0,)),
        outcome(2, {0: 1, 1: 2}, tokens=(0, 1)),
        outcome(3, {1: 1}, tokens=(1,)),
    ]
    return WorkloadRun(outcomes, [1.0, 2.0, 4.0, 5.0], {}, [0, 1], [[7, 7, 7], [7, 7]])


def test_the_readings_of_a_run_counted_by_hand() -> None:
    run = hand_run()
    assert token_times(run) == [[1.0, 2.0, 4.0], [4.0, 5.0]]
    assert first_token_iteration(run, 1) == 3
    assert prefill_steps(run, 1) == [1, 2]
    assert prefill_chunks(run, 1) == [3, 2]
    assert prefill_chunks(run, 0) == [2]
    # rows x longest new x longest end: 1x2x2, 2x3x3 (ends 3, 3), 2x2x5 (ends 4, 5), 1x1x6
    assert padded_attention_scores(run) == [4, 18, 20, 6]
    assert prefill_attention_scores(run, 1) == 38


def test_a_run_with_preemption_or_cache_hits_has_no_attention_count() -> None:
    for change in ({"evicted": [1]}, {"cached_tokens": 16}):
        run = hand_run()
        for name, value in change.items():
            setattr(run.outcomes[2], name, value)
        with pytest.raises(ValueError, match="preemption or cache hits"):
            padded_attention_scores(run)


def test_a_request_that_never_got_a_token_has_no_first_token() -> None:
    run = hand_run()
    run.request_ids.append(9)
    with pytest.raises(ValueError, match="never got a token"):
        first_token_iteration(run, 2)


@pytest.mark.parametrize(
    ("chunks", "text", "gathered"),
    [
        ([384], "384", 384),
        ([28, 28, 28, 20], "28 x3 + 20", 28 + 56 + 84 + 104),
        ([5, 6], "5 + 6", 16),
    ],
)
def test_chunks_are_described_and_their_reads_counted(chunks, text, gathered) -> None:
    assert describe_chunks(chunks) == text
    assert kv_positions_gathered(chunks) == gathered


def test_the_workload_is_short_requests_then_one_long_prompt() -> None:
    workload = long_prompt_arrives(2048, 16.0, num_short=3, long_prompt=40, long_budget=5)
    assert [spec.arrival for spec in workload] == [0.0, 0.0, 0.0, 16.0]
    assert [len(spec.prompt_token_ids) for spec in workload] == [8, 8, 8, 40]
    assert [spec.params.max_tokens for spec in workload] == [64, 64, 64, 5]
    assert workload == long_prompt_arrives(2048, 16.0, num_short=3, long_prompt=40, long_budget=5)


def test_a_stall_summary_reads_gaps_ttft_and_throughput() -> None:
    gaps = [0.01] * 99 + [0.5]
    summary = stall_summary(gaps, long_ttft_s=0.3, tokens=200, duration_s=4.0)
    assert summary.worst_gap_s == 0.5
    assert summary.median_gap_s == pytest.approx(0.01)
    assert 0.01 < summary.p99_gap_s < 0.5
    assert summary.long_ttft_s == 0.3 and summary.tokens_per_s == 50.0


def test_the_engine_summary_counts_only_the_short_requests_gaps() -> None:
    run = hand_run()
    run.arrivals = {0: Arrival(0, 0.0), 1: Arrival(1, 1.5)}
    run.outcomes[2].finished = [0]
    run.outcomes[3].finished = [1]
    summary = engine_stall_summary(run, long_index=1)
    assert summary.worst_gap_s == 2.0  # request 0's gaps: 1.0, 2.0; request 1's are left out
    assert summary.long_ttft_s == pytest.approx(4.0 - 1.5)
    assert summary.tokens_per_s == 5 / 5.0


def test_the_http_summary_reads_the_records_and_refuses_failures() -> None:
    records = [
        RequestRecord(8, output_tokens=3, ttft=0.02, itl=[0.01, 0.2], e2e=0.23),
        RequestRecord(384, output_tokens=2, ttft=0.4, itl=[0.9], e2e=1.3),
    ]
    summary = http_stall_summary(HttpRun(records, duration=2.5), long_index=1)
    assert summary.worst_gap_s == 0.2 and summary.long_ttft_s == 0.4
    assert summary.tokens_per_s == 5 / 2.5
    records.append(RequestRecord(8, error="HTTP 429: queue full"))
    with pytest.raises(ValueError, match="1 requests failed, the first: HTTP 429"):
        http_stall_summary(HttpRun(records, duration=2.5), long_index=1)
