"""Lesson 31's helpers (`llmengine.lessons.host_timeline`): the timings are positive and of
the things they name, the timeline holds one forward and two host intervals per step (and a
worker's build per step with the overlap), in order, and the figure draws one lane each."""

from __future__ import annotations

import pytest

import llmengine
from llmengine.bench.decode_step import random_llama
from llmengine.lessons import host_timeline
from llmengine.model.config import LlamaConfig

TINY = LlamaConfig.from_dict(
    {
        "model_type": "llama",
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
    },
    source="TINY",
)


def test_best_us_is_the_fastest_rounds_median() -> None:
    assert host_timeline.best_us(lambda: sum(range(100)), repeats=20, rounds=2) > 0
    assert host_timeline.operator_cost_us() > 0


def test_call_costs_time_the_three_ways_of_one_row() -> None:
    costs = host_timeline.call_costs(random_llama(TINY, seed=0, std=0.2), context=40, blocks=8)
    assert list(costs) == ["eager forward", "graph, through dynamo", "graph, called directly"]
    assert all(us > 0 for us in costs.values())


@pytest.mark.parametrize("overlap", [False, True])
def test_the_timeline_has_each_steps_intervals_in_order(model, overlap: bool) -> None:
    engine = llmengine.Engine(model, num_blocks=16, num_slots=1, overlap=overlap)
    timeline = host_timeline.record_timeline(engine, list(range(1, 9)), steps=5)
    engine.close()
    lanes = timeline.lanes
    assert len(lanes["forward"]) == 5 and len(lanes["host"]) == 10
    for step, (start, end) in enumerate(lanes["forward"]):
        before, after = lanes["host"][2 * step], lanes["host"][2 * step + 1]
        assert before[0] <= before[1] == start <= end == after[0] <= after[1]
    worker = lanes.get("worker: next step's inputs", [])
    # A guess beside every forward, the last one's too (the runner cannot know it is the
    # last); positions 8-13 stay in the first block, so no step is left unguessed.
    assert len(worker) == (5 if overlap else 0)
    fig = host_timeline.plot_timeline(timeline, "test")
    assert len(fig.axes[0].get_yticks()) == len(lanes)
