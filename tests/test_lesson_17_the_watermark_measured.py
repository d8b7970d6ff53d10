"""Lesson 17's claims, recomputed: the lookahead reserve and the watermark sweep.

The scheduling numbers depend on prompt lengths and budgets only (greedy, no early stop), so
seeded prompts of the lesson's lengths give the lesson's tables. The engine runs recompute a
few cells of each committed table; the verdict is recomputed from the committed sweep tables.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from statistics import fmean

import pytest
import seed_tables as seeds
from report_tables import read_report_table

import llmengine
from llmengine import Engine, Request, SamplingParams, Scheduler
from llmengine.bench.workloads import mixed_workload, poisson_arrivals, uniform_burst
from llmengine.lessons.lookahead import LookaheadEngine, LookaheadScheduler, trace_reserve
from llmengine.lessons.watermarks import (
    WatermarkRun,
    WatermarkVerdict,
    judge_against_zero,
    sweep_watermarks,
    vllm_watermark_blocks,
)

# The lesson's cramped case and its sweeps.
CRAMPED_REQUESTS, CRAMPED_PROMPT, CRAMPED_BUDGET, CRAMPED_POOL = 4, 8, 16, 9
RULES = {str(blocks): blocks for blocks in range(5)} | {"vLLM 1%": vllm_watermark_blocks}
MIXED_SLOTS, MIXED_BLOCK = 6, 4


def mixed(model: llmengine.Llama) -> list:
    return poisson_arrivals(
        mixed_workload(
            16, prompt_lens=(4, 12), budgets=(8, 32), vocab_size=model.config.vocab_size, seed=0
        ),
        rate=0.5,
        seed=0,
    )


def subset(*rules: str) -> dict[str, int | Callable[[int], int]]:
    return {rule: RULES[rule] for rule in rules}


def table_by(name: str, *keys: str) -> dict[tuple[str, ...], dict[str, str]]:
    return {tuple(row[key] for key in keys): row for row in read_report_table(name)}


def names(request_ids: list[int]) -> str:
    return " ".join(f"r{request_id}" for request_id in request_ids)


# -- the lookahead reserve ---------------------------------------------------------------


def cramped_request(request_id: int) -> Request:
    return Request(
        request_id=request_id,
        prompt_token_ids=[1] * CRAMPED_PROMPT,
        params=SamplingParams(max_tokens=CRAMPED_BUDGET, ignore_eos=True),
        arrival=request_id,
        block_size=seeds.DAY34_BLOCK,
    )


@pytest.mark.parametrize(("pool", "admitted"), [(8, 2), (9, 3), (11, 3), (12, 4)])
def test_lookahead_reserve_admits_while_a_block_stays_free_per_row(
    pool: int, admitted: int
) -> None:
    scheduler = LookaheadScheduler(
        num_blocks=pool, block_size=seeds.DAY34_BLOCK, num_slots=CRAMPED_REQUESTS
    )
    for request_id in range(CRAMPED_REQUESTS):
        scheduler.add(cramped_request(request_id))
    decision = scheduler.schedule()
    assert [row.request.request_id for row in decision.rows] == list(range(admitted))
    assert scheduler.pool.num_free >= len(scheduler.running)
    plain = Scheduler(num_blocks=pool, block_size=seeds.DAY34_BLOCK, num_slots=CRAMPED_REQUESTS)
    for request_id in range(CRAMPED_REQUESTS):
        plain.add(cramped_request(request_id))
    assert len(plain.schedule().rows) == min(CRAMPED_REQUESTS, pool // 2)


def test_lookahead_reserve_holds_exactly_one_iteration(model: llmengine.Llama) -> None:
    prompts = [
        list(spec.prompt_token_ids)
        for spec in uniform_burst(
            CRAMPED_REQUESTS, CRAMPED_PROMPT, 1, vocab_size=model.config.vocab_size, seed=17
        )
    ]
    params = SamplingParams(max_tokens=CRAMPED_BUDGET, ignore_eos=True)
    build = {"num_blocks": CRAMPED_POOL, "block_size": seeds.DAY34_BLOCK, "num_slots": 4}
    lookahead = trace_reserve(LookaheadEngine(model, **build), prompts, params)
    plain = trace_reserve(Engine(model, **build), prompts, params)
    assert lookahead.outputs == plain.outputs

    (held,) = lookahead.reserve_held
    crossings = [step.iteration for step in lookahead.steps if step.growth]
    assert held == crossings[0]  # the reserve covers the first boundary crossing...
    first = lookahead.first_eviction
    assert first is not None and first.iteration == crossings[1]  # ...and not the next
    assert first.free == 0 < first.growth
    assert plain.first_eviction is not None and plain.first_eviction.iteration == crossings[0]

    table = read_report_table("watermark-lookahead-steps")
    assert [
        (
            int(row["iteration"]),
            int(row["rows running"]),
            int(row["free blocks"]),
            int(row["blocks growth needs"]),
            row["evicted"],
            row["admitted"],
        )
        for row in table
    ] == [
        (s.iteration, s.running, s.free, s.growth, names(s.evicted), names(s.admitted))
        for s in lookahead.steps[: first.iteration]
    ]


def test_lookahead_reserve_on_the_sweep_pools(model: llmengine.Llama) -> None:
    burst = uniform_burst(
        seeds.DAY34_REQUESTS,
        seeds.DAY34_PROMPT,
        seeds.DAY34_BUDGET,
        vocab_size=model.config.vocab_size,
        seed=34,
    )
    (cell,) = sweep_watermarks(
        model,
        burst,
        [12],
        {"lookahead": 0},
        block_size=seeds.DAY34_BLOCK,
        num_slots=seeds.DAY34_SLOTS,
        engine_class=LookaheadEngine,
    )
    rows = table_by("watermark-lookahead-pools", "workload", "pool (blocks)")
    row = rows["six-request burst", "12"]
    assert int(row["preemptions, lookahead"]) == cell.timing.preemptions
    assert int(row["iterations, lookahead"]) == cell.timing.iterations
    # Day 33: no admission rule spares a pool that preempts at watermark 0.
    for row in rows.values():
        if int(row["preemptions, watermark 0"]):
            assert int(row["preemptions, lookahead"]) > 0


# -- vLLM's rule -------------------------------------------------------------------------


def test_vllm_watermark_is_one_percent_rounded_down() -> None:
    assert [vllm_watermark_blocks(pool) for pool in (8, 48, 99, 100, 199, 200, 1000)] == [
        0,
        0,
        0,
        1,
        1,
        2,
        10,
    ]
    for row in read_report_table("watermark-vllm-rule"):
        pool = int(row["pool (blocks)"])
        assert int(row["vLLM's watermark: int()"]) == vllm_watermark_blocks(pool)
        assert int(row["rounded up instead"]) == math.ceil(0.01 * pool)


# -- the sweeps ------------------------------------------------------------------------


def check_bill(cells: list[WatermarkRun], name: str) -> None:
    rows = table_by(name, "pool (blocks)", "rule")
    for cell in cells:
        row = rows[str(cell.pool_blocks), cell.rule]
        assert int(row["watermark (blocks)"]) == cell.watermark
        if cell.timing is None:
            assert row["door"] == "refuses" and row["iterations"] == "n/a"
            continue
        assert row["door"] == "admits"
        assert int(row["preemptions"]) == cell.timing.preemptions
        assert int(row["iterations"]) == cell.timing.iterations
        assert int(row["forward positions"]) == cell.timing.total_forward_tokens
        assert row["recompute share"] == f"{cell.timing.recompute_fraction:.1%}"
        assert row["occupancy"] == f"{cell.timing.occupancy:.3f}"


def check_latency(cells: list[WatermarkRun], name: str) -> None:
    rows = table_by(name, "pool (blocks)", "rule")
    for cell in cells:
        if cell.timing is None:
            assert (str(cell.pool_blocks), cell.rule) not in rows
            continue
        row = rows[str(cell.pool_blocks), cell.rule]
        assert int(row["victims"]) == len(cell.latencies["victims"])
        for group in ("victims", "straight through", "all"):
            for q in (50, 99):
                percentile = cell.latency_percentile(group, q)
                assert row[f"{group} p{q}"] == (
                    "n/a" if math.isnan(percentile) else f"{percentile:.1f}"
                )


def test_day34_burst_sweep_one_text_and_the_tables(model: llmengine.Llama) -> None:
    burst = uniform_burst(
        seeds.DAY34_REQUESTS,
        seeds.DAY34_PROMPT,
        seeds.DAY34_BUDGET,
        vocab_size=model.config.vocab_size,
        seed=34,
    )
    build = {"block_size": seeds.DAY34_BLOCK, "num_slots": seeds.DAY34_SLOTS}
    # The tight pool at a few of the lesson's rules, and the smallest pool's door.
    cells = sweep_watermarks(model, burst, [12], subset("0", "2", "4", "vLLM 1%"), **build)
    cells += sweep_watermarks(model, burst, [8], subset("1", "4"), **build)
    ran = [cell for cell in cells if cell.run is not None]
    assert len(ran) == 4 and len({tuple(map(tuple, cell.run.outputs)) for cell in ran}) == 1
    assert [(cell.pool_blocks, cell.rule) for cell in cells if cell.refusal] == [
        (8, "1"),
        (8, "4"),
    ]
    check_bill(cells, "watermark-burst-bill")
    check_latency(cells, "watermark-burst-latency")
    # The watermark-0 rows are Day 34's bill.
    for (pool, rule), row in table_by("watermark-burst-bill", "pool (blocks)", "rule").items():
        if rule == "0":
            expected = seeds.DAY34[int(pool)]
            assert float(row["occupancy"]) == expected.occupancy
            assert float(row["recompute share"].rstrip("%")) == expected.recompute_percent


def test_mixed_workload_sweep_one_text_and_the_tables(model: llmengine.Llama) -> None:
    cells = sweep_watermarks(
        model,
        mixed(model),
        [12],
        subset("0", "2", "3"),
        block_size=MIXED_BLOCK,
        num_slots=MIXED_SLOTS,
    )
    assert [cell.rule for cell in cells if cell.refusal] == ["3"]
    check_bill(cells, "watermark-mixed-bill")
    check_latency(cells, "watermark-mixed-latency")


def test_a_watermark_as_large_as_the_pool_is_a_refusal(model: llmengine.Llama) -> None:
    burst = uniform_burst(2, 5, 4, vocab_size=model.config.vocab_size)
    (cell,) = sweep_watermarks(model, burst, [4], {"all": 4}, block_size=4, num_slots=2)
    assert cell.run is None and "watermark must be in" in cell.refusal


# -- the verdict -----------------------------------------------------------------------


def verdict(**changes: float) -> WatermarkVerdict:
    fields = {
        "rule": "1",
        "pools_run": 3,
        "pools_refused": 0,
        "preemptions": 10,
        "preemptions_at_zero": 12,
        "recomputed": 90,
        "recomputed_at_zero": 100,
        "positions": 190,
        "positions_at_zero": 200,
        "iterations": 102,
        "iterations_at_zero": 100,
        "occupancy_change": -0.01,
        "p99_ratio": 1.02,
    }
    return WatermarkVerdict(**(fields | changes))


def test_verdict_rule() -> None:
    assert verdict().break_even == pytest.approx(0.2)
    assert not verdict().earns_the_default
    assert verdict(iterations=99, p99_ratio=1.0).earns_the_default
    assert verdict(iterations=100, p99_ratio=0.9).earns_the_default
    assert not verdict(iterations=99, p99_ratio=1.0, pools_refused=1).earns_the_default
    assert not verdict(iterations=99, p99_ratio=1.1).earns_the_default
    assert not verdict(iterations=100, p99_ratio=1.0).earns_the_default
    assert verdict(iterations=100).break_even is None
    assert verdict(positions=200).break_even is None


def test_verdict_follows_from_the_sweep_tables() -> None:
    verdicts = table_by("watermark-verdict", "workload", "rule")
    bills = {
        "six-request burst": table_by("watermark-burst-bill", "pool (blocks)", "rule"),
        "mixed, with arrivals": table_by("watermark-mixed-bill", "pool (blocks)", "rule"),
    }
    latencies = {
        "six-request burst": table_by("watermark-burst-latency", "pool (blocks)", "rule"),
        "mixed, with arrivals": table_by("watermark-mixed-latency", "pool (blocks)", "rule"),
    }
    for (workload, rule), row in verdicts.items():
        if rule == "lookahead":
            continue
        bill = bills[workload]
        pools = [
            pool for pool, other in bill if other == rule and bill[pool, rule]["door"] == "admits"
        ]
        refused = [pool for pool, other in bill if other == rule and pool not in pools]
        assert (int(row["pools run"]), int(row["pools refused"])) == (len(pools), len(refused))
        for column in ("preemptions", "iterations"):
            assert int(row[column]) == sum(int(bill[pool, rule][column]) for pool in pools)
            assert int(row[f"{column} at 0"]) == sum(int(bill[pool, "0"][column]) for pool in pools)
        # Same text, so the forwards differ by the recompute only, less one position per
        # eviction: a resumed prefill counts its newest token as recomputed, and it is not.
        positions = sum(int(bill[pool, rule]["forward positions"]) for pool in pools)
        positions_at_zero = sum(int(bill[pool, "0"]["forward positions"]) for pool in pools)
        recomputed = int(row["recomputed"]) - int(row["recomputed at 0"])
        evictions = int(row["preemptions"]) - int(row["preemptions at 0"])
        assert positions - positions_at_zero == recomputed - evictions
        extra = int(row["iterations"]) - int(row["iterations at 0"])
        if positions < positions_at_zero and extra > 0:
            assert row["break-even"] == f"{extra / (positions_at_zero - positions):.2f}"
        else:
            assert row["break-even"] == "n/a"
        p99 = fmean(
            float(latencies[workload][pool, rule]["all p99"])
            / float(latencies[workload][pool, "0"]["all p99"])
            for pool in pools
        )
        assert float(row["p99 (x of 0)"]) == pytest.approx(p99, abs=0.005)
    # The lesson's verdict: every rule that keeps blocks free preempts less and takes longer,
    # and none earns the default.
    for (_, rule), row in verdicts.items():
        if rule != "vLLM 1%":
            assert int(row["preemptions"]) < int(row["preemptions at 0"])
            assert int(row["iterations"]) > int(row["iterations at 0"])
        assert row["earns the default"] == "no"


def test_judge_against_zero_sums_over_admitted_pools(model: llmengine.Llama) -> None:
    burst = uniform_burst(3, 5, 12, vocab_size=model.config.vocab_size, seed=3)
    cells = sweep_watermarks(model, burst, [6, 5], {"0": 0, "1": 1}, block_size=4, num_slots=3)
    (judged,) = judge_against_zero(cells)
    ran = [cell for cell in cells if cell.rule == "1" and cell.timing is not None]
    zero = {cell.pool_blocks: cell for cell in cells if cell.rule == "0"}
    assert (judged.pools_run, judged.pools_refused) == (1, 1)
    assert judged.iterations == sum(cell.timing.iterations for cell in ran)
    assert judged.iterations_at_zero == sum(
        zero[cell.pool_blocks].timing.iterations for cell in ran
    )
