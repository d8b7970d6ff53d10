"""Lesson 29: its reader of the live feed and what it computes from the snapshots, on small
made-up snapshots, and the recorder against a real preempting server; the burst is what the
lesson says; the scheduler-only replay agrees with the engine."""

from __future__ import annotations

import dataclasses

import pytest
from matplotlib.figure import Figure

import llmengine
from llmengine.bench.http_client import run_over_http
from llmengine.bench.workloads import uniform_burst
from llmengine.lessons.exercises import embedded_model
from llmengine.lessons.exercises.lesson_29 import replay_schedule
from llmengine.lessons.live_server import live_server, read_metrics
from llmengine.lessons.watching import (
    OWN_LEN,
    REQUESTS,
    SHARED_LEN,
    FeedRecorder,
    Preemption,
    dropped_events,
    expand_owners,
    finished_ids,
    lesson_burst,
    parse_sse,
    pool_over_time,
    preemptions,
    states_over_time,
    step_gaps,
)
from llmengine.lessons.watching_figure import draw_cascade, draw_pool_over_time, draw_rates
from llmengine.server.engine_snapshot import CACHED, FREE


def snapshot(t: float, step: int, owners, running=(), waiting=(), events=(), **extra) -> dict:
    return {
        "t": t,
        "step": step,
        "steps": extra.pop("steps", 1),
        "pool": {"size": sum(count for _, count in owners), "block_size": 16, "owners": owners},
        "host": {"size": 0, "owners": []},
        "running": [list(row) for row in running],
        "waiting": [list(row) for row in waiting],
        "swapped": [],
        "events": list(events),
        "rates": {"tokens_per_s": 10.0, "ttft_ms": None, "itl_ms": 2.0},
        "step_ms": [0.5, 4.0],
        **extra,
    }


SNAPSHOTS = [
    snapshot(5.0, 0, [[FREE, 6]], steps=0),
    snapshot(
        5.1, 4, [[0, 3], [1, 2], [FREE, 1]],
        running=[(0, 8, 3, "decode"), (1, 8, 2, "decode")], waiting=[(2, 8, 0, "waiting")],
        steps=4,
    ),
    snapshot(
        5.25, 9, [[0, 4], [CACHED, 1], [2, 1]],
        running=[(0, 8, 7, "decode"), (2, 8, 1, "prefill")], waiting=[(1, 8, 5, "preempted")],
        events=[
            {"step": 6, "kind": "preempt", "victim": 1, "for": 0, "mode": "recompute"},
            {"step": 7, "kind": "finished", "request": 3},
            {"step": 8, "kind": "preempt", "victim": 2, "for": 2, "mode": "swap"},
        ],
        dropped=2, steps=5,
    ),
]  # fmt: skip


def test_parse_sse_reads_data_lines_only() -> None:
    lines = [": llmengine engine events", "", 'data: {"step": 1}', ": keepalive", 'data: {"a":2}']
    assert list(parse_sse(lines)) == [{"step": 1}, {"a": 2}]


def test_owners_expand_in_block_order() -> None:
    assert expand_owners([[3, 2], [FREE, 1], [CACHED, 2], [3, 1]]) == [
        3,
        3,
        FREE,
        CACHED,
        CACHED,
        3,
    ]
    assert expand_owners([]) == []


def test_pool_over_time_counts_each_owner_per_snapshot() -> None:
    pool = pool_over_time(SNAPSHOTS)
    assert [round(t, 3) for t in pool.t] == [0.0, 0.1, 0.25]
    assert pool.steps == [0, 4, 9]
    assert pool.held == {0: [0, 3, 4], 1: [0, 2, 0], 2: [0, 0, 1]}
    assert pool.free == [6, 1, 0]
    assert pool.cached == [0, 0, 1]
    assert pool.size == 6


def test_preemptions_and_events_from_the_snapshots() -> None:
    assert preemptions(SNAPSHOTS) == [
        Preemption(0.25, 6, victim=1, made_room_for=0, mode="recompute"),
        Preemption(0.25, 8, victim=2, made_room_for=2, mode="swap"),
    ]
    assert finished_ids(SNAPSHOTS) == {3}
    assert dropped_events(SNAPSHOTS) == 2
    assert step_gaps(SNAPSHOTS) == [4, 5]


def test_states_over_time_follow_every_queue() -> None:
    assert states_over_time(SNAPSHOTS) == {
        0: [(4, "decode"), (9, "decode")],
        1: [(4, "decode"), (9, "preempted")],
        2: [(4, "waiting"), (9, "prefill")],
    }


def test_the_figures_draw_what_they_are_given() -> None:
    preempted = preemptions(SNAPSHOTS)
    pool_figure = draw_pool_over_time(pool_over_time(SNAPSHOTS), preempted)
    assert isinstance(pool_figure, Figure)
    assert "6 blocks, 3 snapshots" in pool_figure.axes[0].get_title()
    cascade = draw_cascade(states_over_time(SNAPSHOTS), preempted, last_step=9)
    ax = cascade.axes[0]
    assert [label.get_text() for label in ax.get_yticklabels()] == ["r0", "r1", "r2"]
    # one arrow: r1 made room for r0; r2 gave way for itself, a cross and no arrow
    assert len([child for child in ax.texts if child.arrow_patch is not None]) == 1
    assert "2 preemptions" in ax.get_title()
    assert len(draw_rates(SNAPSHOTS).axes) == 3


def test_the_lesson_burst_shares_its_opening() -> None:
    burst = lesson_burst()
    assert len(burst) == REQUESTS
    prompts = [spec.prompt_token_ids for spec in burst]
    assert len({prompt[:SHARED_LEN] for prompt in prompts}) == 1
    assert len({prompt[SHARED_LEN:] for prompt in prompts}) == REQUESTS
    assert {len(prompt) for prompt in prompts} == {SHARED_LEN + OWN_LEN}
    assert lesson_burst() == burst  # seeded


def test_the_replay_agrees_with_the_engine() -> None:
    """Preemptions and steps of a small preempting burst: the scheduler alone and the engine."""
    burst = uniform_burst(4, 8, 24, vocab_size=1000, seed=3)
    engine = llmengine.Engine(
        embedded_model("eager"), num_blocks=5, block_size=16, num_slots=4,
        enable_prefix_caching=True,
    )  # fmt: skip
    for spec in burst:
        engine.add_request(list(spec.prompt_token_ids), spec.params)
    evicted, peak = 0, 0
    while engine.has_unfinished():
        outcome = engine.step()
        evicted += len(outcome.evicted)
        peak = max(peak, outcome.held_blocks)
    replay = replay_schedule(tuple(burst), 5, 4)
    assert evicted > 0
    assert (replay.preemptions, replay.peak_blocks, replay.steps) == (
        evicted,
        peak,
        engine.iteration,
    )


def test_the_recorder_hears_a_preempting_burst_to_its_end() -> None:
    burst = uniform_burst(6, 8, 24, vocab_size=1000, seed=4)
    options = ["--kernels", "eager", "--num-blocks", "5", "--max-num-seqs", "4"]
    options += ["--served-model-name", "served"]
    with live_server(options) as server:
        with FeedRecorder(server.url, expected=len(burst), max_seconds=30) as recorder:
            run = run_over_http(server.api, "served", burst)
        metrics = read_metrics(server.url)
        # An idle server reports nobody finishing: the recorder stops at its bound and says so.
        idle = FeedRecorder(server.url, expected=1, max_seconds=1.5)
        with pytest.raises(RuntimeError, match="feed"), idle:
            pass
    snapshots = recorder.snapshots
    assert all(record.ok for record in run.records)
    assert finished_ids(snapshots) == set(range(len(burst)))
    assert snapshots[-1]["running"] == snapshots[-1]["waiting"] == []
    assert len(preemptions(snapshots)) == metrics["llmengine_preemptions_total"] > 0
    assert dataclasses.asdict(preemptions(snapshots)[0])["made_room_for"] >= 0
