"""Lesson 21, prefix caching: its deterministic tables recomputed with the package.

The shared system prompt runs on the engine and through an in-process server (the lesson's
live servers run the same app); the six-request burst runs with and without caching, its victims
watched; `n = 4` goes through a served engine. Each number is checked against the committed
report and, where the lesson states a rule, against the rule.
"""

from __future__ import annotations

from typing import Any

import pytest
import seed_tables as seeds
from report_tables import read_report_table
from server_helpers import MODEL_NAME, TIMEOUT, served

import llmengine
from llmengine.bench.batchbench import PoolResult, WorkloadRun, run_workload, sweep_pool_sizes
from llmengine.bench.http_client import run_over_http
from llmengine.bench.workloads import RequestSpec, poisson_arrivals, uniform_burst
from llmengine.kv.prefix_cache import prefix_keys
from llmengine.lessons.prefix_sharing import (
    SPEECHES,
    SYSTEM_PROMPT,
    Absence,
    Admission,
    VictimWatch,
    admissions,
    system_prompt_workload,
)

BLOCK_SIZE, SLOTS, POOL = 16, 8, 128
DAY34_BLOCK = seeds.DAY34_BLOCK


def cells(name: str, *columns: str) -> list[tuple[str, ...]]:
    """The given columns of every row of `reports/NAME.md`, as text."""
    return [tuple(row[column] for column in columns) for row in read_report_table(name)]


def as_text(*values: object) -> tuple[str, ...]:
    return tuple(str(value) for value in values)


def cached_tokens(run: WorkloadRun) -> int:
    return sum(outcome.cached_tokens for outcome in run.outcomes)


@pytest.fixture(scope="module")
def workload(tokenizer: Any) -> list[RequestSpec]:
    return system_prompt_workload(tokenizer)


@pytest.fixture(scope="module")
def prompt_lens(workload: list[RequestSpec]) -> list[int]:
    return [len(spec.prompt_token_ids) for spec in workload]


def lesson_engine(
    model: llmengine.Llama, caching: bool, tokenizer: object = None
) -> llmengine.Engine:
    """The lesson's system-prompt engine: its pool, blocks and slots, caching on or off."""
    return llmengine.Engine(
        model,
        num_blocks=POOL,
        block_size=BLOCK_SIZE,
        num_slots=SLOTS,
        enable_prefix_caching=caching,
        tokenizer=tokenizer,
    )


@pytest.fixture(scope="module")
def engine_runs(
    model: llmengine.Llama, workload: list[RequestSpec]
) -> dict[bool, tuple[llmengine.Engine, WorkloadRun]]:
    found = {}
    for caching in (False, True):
        engine = lesson_engine(model, caching)
        found[caching] = (engine, run_workload(engine, workload))
    return found


@pytest.fixture(scope="module")
def offline_texts(tokenizer: Any, engine_runs) -> list[str]:
    _, run = engine_runs[False]
    return [tokenizer.decode(tokens, skip_special_tokens=True) for tokens in run.outputs]


# -- a shared system prompt ---------------------------------------------------------------


def test_only_the_system_prompts_full_blocks_have_one_key(
    tokenizer: Any, workload: list[RequestSpec]
) -> None:
    keys = [prefix_keys(spec.prompt_token_ids, BLOCK_SIZE) for spec in workload]
    rows = []
    for block in range(max(map(len, keys))):
        holders = [request_keys[block] for request_keys in keys if block < len(request_keys)]
        rows.append(as_text(block, len(holders), len(set(holders))))
    assert rows == cells(
        "prefix-system-prompt-keys", "block", "requests with this block full", "distinct keys"
    )
    shared = len(tokenizer.encode(SYSTEM_PROMPT)) // BLOCK_SIZE
    assert [len(set(column)) for column in zip(*keys, strict=False)][:shared] == [1] * shared
    assert len(set(k[shared] for k in keys)) == len(SPEECHES)


def test_system_prompt_on_the_engine_takes_the_shared_blocks_and_keeps_the_text(
    tokenizer: Any, workload: list[RequestSpec], prompt_lens: list[int], engine_runs
) -> None:
    (_, off), (engine, on) = engine_runs[False], engine_runs[True]
    assert on.outputs == off.outputs
    shared_positions = len(tokenizer.encode(SYSTEM_PROMPT)) // BLOCK_SIZE * BLOCK_SIZE
    # The rule: every request but the first takes the system prompt's full blocks.
    assert cached_tokens(on) == (len(workload) - 1) * shared_positions
    assert on.timing().total_forward_tokens + cached_tokens(on) == off.timing().total_forward_tokens
    assert engine.scheduler.pool.evictions == 0
    assert not any(outcome.evicted for run in (on, off) for outcome in run.outcomes)
    rows = []
    for caching, run in ((False, off), (True, on)):
        timing = run.timing()
        rows.append(
            as_text(
                "on" if caching else "off",
                timing.iterations,
                sum(prompt_lens),
                timing.total_forward_tokens,
                cached_tokens(run),
                f"{cached_tokens(run) / sum(prompt_lens):.1%}",
                max(timing.held_blocks),
                timing.total_tokens,
            )
        )
    assert rows == cells(
        "prefix-system-prompt-engine",
        "caching",
        "iterations",
        "prompt positions",
        "forward positions",
        "cached positions",
        "hit rate",
        "most blocks held",
        "tokens",
    )
    assert {row["same text"] for row in read_report_table("prefix-system-prompt-engine")} == {"yes"}


def test_system_prompt_admissions_table_is_each_prefill(
    prompt_lens: list[int], engine_runs
) -> None:
    off = admissions(engine_runs[False][1], prompt_lens)
    on = admissions(engine_runs[True][1], prompt_lens)
    rows = [
        as_text(f"r{b.index}", b.iteration, b.tokens, a.computed, b.computed, b.cached)
        for a, b in zip(off, on, strict=True)
    ]
    assert rows == cells(
        "prefix-system-prompt-admissions",
        "request",
        "admitted in iteration",
        "prompt",
        "prefill computed, off",
        "prefill computed, on",
        "cached, on",
    )
    assert [a.cached for a in on][1:] == [on[1].cached] * (len(on) - 1) and on[0].cached == 0


@pytest.mark.parametrize("arrivals", ["all at once", "Poisson 16/s"])
def test_system_prompt_over_http_metrics_are_the_engines(
    model: llmengine.Llama,
    tokenizer: Any,
    workload: list[RequestSpec],
    offline_texts: list[str],
    arrivals: str,
) -> None:
    specs = workload if arrivals == "all at once" else poisson_arrivals(workload, 16.0, seed=21)
    table = {
        row["caching"]: row
        for row in read_report_table("prefix-system-prompt-http-metrics")
        if row["arrivals"] == arrivals
    }
    engine_table = {row["caching"]: row for row in read_report_table("prefix-system-prompt-engine")}
    for caching in (False, True):
        engine = lesson_engine(model, caching, tokenizer)
        with served(engine, tokenizer) as server:
            run = run_over_http(f"{server.url}/v1", MODEL_NAME, specs, timeout=TIMEOUT)
            metrics = server.metrics()
        assert [record.text for record in run.records] == offline_texts
        row = table["on" if caching else "off"]
        hits = int(metrics["llmengine_prefix_cache_hit_tokens_total"])
        forward = int(metrics["llmengine_forward_tokens_total"])
        assert (str(hits), str(forward)) == (row["cache hit tokens"], row["forward tokens"])
        expected = engine_table[row["caching"]]
        assert (row["cache hit tokens"], row["forward tokens"]) == (
            expected["cached positions"],
            expected["forward positions"],
        )
        assert row["same text as offline"] == "yes"


def test_admissions_refuse_a_chunked_prefill(
    model: llmengine.Llama, workload: list[RequestSpec], prompt_lens: list[int]
) -> None:
    engine = llmengine.Engine(
        model,
        num_blocks=POOL,
        block_size=BLOCK_SIZE,
        num_slots=SLOTS,
        enable_prefix_caching=True,
        max_num_batched_tokens=32,
    )
    with pytest.raises(ValueError, match="chunked prefill"):
        admissions(run_workload(engine, workload[:2]), prompt_lens[:2])


# -- the recompute bill, revisited ----------------------------------------------------------


def day34_burst(model: llmengine.Llama) -> list[RequestSpec]:
    return uniform_burst(
        seeds.DAY34_REQUESTS,
        seeds.DAY34_PROMPT,
        seeds.DAY34_BUDGET,
        vocab_size=model.config.vocab_size,
        seed=34,
    )


@pytest.fixture(scope="module")
def sweeps(model: llmengine.Llama) -> dict[bool, list[PoolResult]]:
    return {
        caching: sweep_pool_sizes(
            model,
            day34_burst(model),
            seeds.DAY34_POOLS,
            block_size=DAY34_BLOCK,
            num_slots=seeds.DAY34_SLOTS,
            enable_prefix_caching=caching,
        )
        for caching in (False, True)
    }


@pytest.fixture(scope="module")
def watched(
    model: llmengine.Llama, sweeps: dict[bool, list[PoolResult]]
) -> dict[int, list[tuple[Absence, Admission]]]:
    """Every pool's eviction with caching on, each with the resumed prefill that ended it."""
    found = {}
    for result in sweeps[True]:
        engine = llmengine.Engine(
            model,
            num_blocks=result.pool_blocks,
            block_size=DAY34_BLOCK,
            num_slots=seeds.DAY34_SLOTS,
            enable_prefix_caching=True,
        )
        watch = VictimWatch(engine)
        run = run_workload(watch, day34_burst(model))
        assert run.outputs == result.outputs
        resumed = {
            (run.request_ids[a.index], a.iteration): a
            for a in admissions(run, [seeds.DAY34_PROMPT] * seeds.DAY34_REQUESTS)
            if a.resumed
        }
        assert len(resumed) == len(watch.absences) == result.timing.preemptions
        found[result.pool_blocks] = [
            (absence, resumed[absence.request_id, absence.back_in]) for absence in watch.absences
        ]
    return found


def test_day34_sweep_with_caching_recomputes_less_on_the_same_schedule(
    sweeps: dict[bool, list[PoolResult]],
) -> None:
    rows = []
    for off, on in zip(sweeps[False], sweeps[True], strict=True):
        assert on.outputs == off.outputs
        assert on.timing.preempted_at == off.timing.preempted_at
        cached = cached_tokens(on.run)
        # No prompt is shared, so every cached position is a recomputation avoided.
        saved = off.timing.total_recomputed_tokens - on.timing.total_recomputed_tokens
        assert cached == saved
        assert on.timing.total_forward_tokens + cached == off.timing.total_forward_tokens
        rows.append(
            as_text(
                on.pool_blocks,
                off.timing.preemptions,
                on.timing.preemptions,
                off.timing.iterations,
                on.timing.iterations,
                off.timing.total_forward_tokens,
                on.timing.total_forward_tokens,
                off.timing.total_recomputed_tokens,
                on.timing.total_recomputed_tokens,
                cached,
            )
        )
    assert rows == cells(
        "prefix-burst-sweep",
        "pool (blocks)",
        "preemptions, off",
        "preemptions, on",
        "iterations, off",
        "iterations, on",
        "forward, off",
        "forward, on",
        "recomputed, off",
        "recomputed, on",
        "cached, on",
    )
    at_12 = {row["pool (blocks)"]: row for row in read_report_table("prefix-burst-sweep")}["12"]
    assert int(at_12["recomputed, off"]) == seeds.DAY34_RECOMPUTED_AT_12
    assert int(at_12["forward, off"]) == seeds.DAY34_FORWARD_POSITIONS[12]


def test_day34_resumes_at_12_say_what_each_victims_blocks_lived(
    watched: dict[int, list[tuple[Absence, Admission]]],
) -> None:
    rows = []
    for absence, admission in watched[12]:
        # A decoding victim's full blocks are exactly those the rule lets it take back.
        assert absence.full_blocks == (admission.tokens - 1) // DAY34_BLOCK
        assert (
            absence.full_blocks
            >= absence.left_after_eviction
            >= absence.left_before_return
            >= admission.cached // DAY34_BLOCK
        )
        assert admission.computed >= 1  # the last token's position, at least
        rows.append(
            as_text(
                f"r{admission.index}",
                absence.evicted_in,
                absence.back_in,
                absence.back_in - absence.evicted_in,
                admission.tokens,
                absence.full_blocks,
                absence.left_after_eviction,
                absence.left_before_return,
                admission.cached // DAY34_BLOCK,
                admission.computed,
            )
        )
    assert rows == cells(
        "prefix-burst-resumes-at-12",
        "request",
        "evicted in",
        "back in",
        "iterations away",
        "tokens",
        "full blocks",
        "left after the eviction step",
        "left before the return step",
        "blocks found",
        "positions computed",
    )


def test_day34_survival_table_adds_up_the_resumes(
    watched: dict[int, list[tuple[Absence, Admission]]], sweeps: dict[bool, list[PoolResult]]
) -> None:
    rows = []
    for result in sweeps[True]:
        pairs = watched[result.pool_blocks]
        assert sum(a.cached for _, a in pairs) == cached_tokens(result.run)
        if not pairs:
            continue
        rows.append(
            (
                result.pool_blocks,
                len(pairs),
                sum(a.cached > 0 for _, a in pairs),
                sum(a.cached == DAY34_BLOCK * b.full_blocks for b, a in pairs),
                sum(b.full_blocks for b, _ in pairs),
                sum(b.left_after_eviction for b, _ in pairs),
                sum(b.left_before_return for b, _ in pairs),
                sum(a.cached // DAY34_BLOCK for _, a in pairs),
            )
        )
    totals = ("all", *(sum(row[column] for row in rows) for column in range(1, 8)))
    assert [as_text(*row) for row in [*rows, totals]] == cells(
        "prefix-burst-survival",
        "pool (blocks)",
        "resumes",
        "found some",
        "found all",
        "full blocks",
        "left after the eviction step",
        "left before the return step",
        "blocks found",
    )


def test_victim_watch_needs_prefix_caching(model: llmengine.Llama) -> None:
    with pytest.raises(ValueError, match="prefix caching"):
        VictimWatch(llmengine.Engine(model, num_blocks=8, block_size=4, num_slots=2))


# -- n = 4 shares the prompt's blocks -----------------------------------------------------


def test_n4_cache_hits_are_three_copies_of_the_blocks_the_rule_allows(
    model: llmengine.Llama, tokenizer: Any
) -> None:
    rows = read_report_table("prefix-n4-shared-prompt")
    assert [row["prompt"] for row in rows] == ["160", "161"]
    passage = tokenizer.encode(SYSTEM_PROMPT + "\n\n".join(SPEECHES))
    n, max_tokens = 4, 16
    greedy = llmengine.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    offline = llmengine.Engine(model, num_blocks=POOL, block_size=BLOCK_SIZE, num_slots=SLOTS)
    for row in rows:
        prompt = passage[: int(row["prompt"])]
        taken = (len(prompt) - 1) // BLOCK_SIZE  # full blocks, not the last token's
        engine = llmengine.Engine(
            model,
            num_blocks=64,
            block_size=BLOCK_SIZE,
            num_slots=n,
            enable_prefix_caching=True,
            tokenizer=tokenizer,
        )
        with served(engine, tokenizer) as server:
            body = {
                "model": MODEL_NAME,
                "prompt": prompt,
                "n": n,
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
            }
            answer = server.post("/v1/completions", body).json()
            metrics = server.metrics()
        texts = [choice["text"] for choice in answer["choices"]]
        reference = offline.generate([prompt], greedy)[0]
        assert texts == [tokenizer.decode(reference, skip_special_tokens=True)] * n
        hits = int(metrics["llmengine_prefix_cache_hit_tokens_total"])
        forward = int(metrics["llmengine_forward_tokens_total"])
        assert hits == (n - 1) * taken * BLOCK_SIZE
        assert forward == n * len(prompt) - hits + n * (max_tokens - 1)
        assert as_text(len(prompt) // BLOCK_SIZE, taken, hits, hits, forward) == (
            row["full blocks"],
            row["blocks each copy takes"],
            row["3 x taken x 16"],
            row["cache hit tokens"],
            row["forward tokens"],
        )
        assert row["forward without caching"] == str(n * len(prompt) + n * (max_tokens - 1))
        assert row["4 texts equal"] == row["= offline"] == "yes"
