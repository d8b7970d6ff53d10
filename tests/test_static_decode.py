"""The static decode step that CUDA graphs capture, run eagerly on the CPU: persistent input
buffers filled in place, a gather of a fixed number of blocks per row under a length mask,
and the fallback to eager for a bucket whose capture fails.

On CUDA the runner captures this step (`StaticDecodeGraphs`); here a runner subclass picks it
on the CPU, so that everything but the capture itself is checked against the eager engine.
The capture and replay are tests/test_cuda.py's.
"""

from __future__ import annotations

import functools
import logging

import pytest
import torch
from test_decode_graph import POOL, TINY, run, workload

import llmengine.runner.cuda_graphs as cuda_graphs
from llmengine.bench.decode_step import random_llama
from llmengine.engine import Engine
from llmengine.model.llama import grouped_query_attention
from llmengine.runner.attention import PagedRow
from llmengine.runner.model_runner import ModelRunner
from llmengine.runner.startup import graph_report
from llmengine.runner.static_decode import grouped_decode_attention
from llmengine.runner.step_buffers import StepBuffers


class StaticRunner(ModelRunner):
    """The runner with the CUDA path's decode graphs, uncaptured unless `capture`: they run
    on the CPU."""

    capture = False

    def decode_graphs_class(self):
        return functools.partial(cuda_graphs.StaticDecodeGraphs, capture=self.capture)


class StaticEngine(Engine):
    def runner_for(self, model, tokenizer) -> ModelRunner:
        return StaticRunner(model, self.config, tokenizer=tokenizer)


@pytest.fixture(scope="module")
def tiny():
    return random_llama(TINY, seed=3, std=0.2)


@pytest.fixture(scope="module")
def eager_tokens(tiny):
    prompts, params = workload(seed=0, count=5)
    return run(Engine(tiny, **POOL), prompts, params)[0]


def test_static_step_gives_the_eager_tokens_from_buffers_changed_in_place(tiny, eager_tokens):
    """Greedy and seeded rows, joining and leaving (buckets 2 and 4 padded for 1 and 3 rows,
    5 rows eager), under preemption: the eager engine's tokens, and every graph step reads
    the same device buffers, refilled with its rows, never new ones."""
    engine = StaticEngine(tiny, decode_graph=(2, 4), **POOL)
    graphs = engine.runner.graphs
    addresses = {
        bucket: (buffers.device_tensor.data_ptr(), buffers.staging.data_ptr())
        for bucket, buffers in graphs.buffers.items()
    }
    seen_positions = set()
    upload = StepBuffers.upload

    def recording_upload(buffers: StepBuffers) -> None:
        upload(buffers)
        seen_positions.add(tuple(buffers.positions.tolist()))

    patch = pytest.MonkeyPatch()
    patch.setattr(StepBuffers, "upload", recording_upload)
    try:
        prompts, params = workload(seed=0, count=5)
        tokens, used, preempted = run(engine, prompts, params)
    finally:
        patch.undo()
    assert tokens == eager_tokens
    assert sum(used) > 0 and 0 in used and preempted > 0
    assert len(seen_positions) >= sum(used) // 2  # the buffers' contents change step by step
    for bucket, buffers in graphs.buffers.items():
        assert (buffers.device_tensor.data_ptr(), buffers.staging.data_ptr()) == addresses[bucket]
    report = graph_report(graphs).splitlines()
    assert report[0] == "decode graph buckets in use: [2, 4]"
    assert [line.split(":")[0].strip() for line in report[1:]] == ["bucket 2", "bucket 4"]
    assert all(line.endswith("not captured") for line in report[1:])


def test_a_bucket_whose_capture_fails_runs_eager(tiny, eager_tokens, monkeypatch, caplog):
    """Capture raises for bucket 4 and "captures" bucket 2 (the step itself, run eagerly):
    start-up says why bucket 4 is left out, its decodes run eager and say so, and the
    tokens are still the eager engine's."""

    def capture(step, pool):
        logits, _ = step()
        if len(logits) == 4:
            raise RuntimeError("no capture here")
        return step

    monkeypatch.setattr(cuda_graphs, "capture", capture)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", object)
    monkeypatch.setattr(StaticRunner, "capture", True)
    with caplog.at_level(logging.INFO, logger="llmengine.runner"):
        engine = StaticEngine(tiny, decode_graph=(2, 4), **POOL)
    graphs = engine.runner.graphs
    assert graphs.buckets == [2]
    assert graphs.failures == {4: "RuntimeError: no capture here"}
    assert set(graphs.capture_seconds) == {2} and set(graphs.warmup_seconds) == {2, 4}
    assert "bucket 4: left out, eager: RuntimeError: no capture here" in caplog.text
    assert "bucket 2: gathered attention, warm-up" in caplog.text and "capture" in caplog.text
    prompts, params = workload(seed=0, count=5)
    ids = engine.add_requests(prompts, params)
    paths = []
    while engine.has_unfinished():
        outcome = engine.step()
        paths.append((outcome.rows, outcome.prefill_rows, outcome.forward))
    assert [engine.release(i).output_token_ids for i in ids] == eager_tokens
    decodes = {(rows, path) for rows, prefill, path in paths if not prefill}
    assert {(rows, path) for rows, path in decodes if rows > 2} <= {
        (3, "eager_no_bucket"),
        (4, "eager_no_bucket"),
        (5, "eager_no_bucket"),
    }
    assert (2, "decode_graph") in decodes or (1, "decode_graph") in decodes


def test_without_cuda_every_capture_fails_and_the_engine_runs_eager(tiny, monkeypatch):
    """Capture asked for on a machine without CUDA: every bucket is left out, with torch's
    reason, and every step runs eager, saying so, with the eager engine's tokens."""
    monkeypatch.setattr(StaticRunner, "capture", True)
    engine = StaticEngine(tiny, decode_graph=(2,), **POOL)
    assert engine.runner.graphs.buckets == []
    assert set(engine.runner.graphs.failures) == {2}
    prompts, params = workload(seed=4, count=2)
    ids = engine.add_requests(prompts, params)
    paths = set()
    while engine.has_unfinished():
        paths.add(engine.step().forward)
    assert paths == {"eager_prefill", "eager_no_bucket"} and engine.runner.graph_steps == 0
    expected = run(Engine(tiny, **POOL), prompts, params)[0]
    assert [engine.release(i).output_token_ids for i in ids] == expected


def test_buffers_stage_rows_and_pad_into_the_scratch_block():
    buffers = StepBuffers(4, 5, block_size=4, scratch_block=10, device=torch.device("cpu"))
    buffers.fill([PagedRow([9], 5, [2, 4]), PagedRow([8], 3, [6, 7])])
    host = buffers.staging.t()  # a row's numbers, then its table
    assert host[:, :4].tolist() == [[9, 5, 17, 6], [8, 3, 27, 4], [0, 0, 40, 1], [0, 0, 40, 1]]
    assert host[0, 4:6].tolist() == [2, 4] and host[1, 4].item() == 6
    assert host[2:, 4].tolist() == [10, 10]
    assert buffers.token_ids.is_contiguous() and buffers.write_slots.is_contiguous()
    assert buffers.token_ids.tolist() == [0, 0, 0, 0]  # staged only: the device side waits
    buffers.upload()
    assert buffers.token_ids.tolist() == [9, 8, 0, 0] and buffers.lengths.tolist()[:2] == [6, 4]
    assert buffers.block_tables[:2, :2].tolist() == [[2, 4], [6, 10]]
    staged = buffers.staging.clone()
    with pytest.raises(ValueError, match="its table has 1"):
        buffers.fill([PagedRow([1], 2, [3]), PagedRow([1], 4, [3])])  # needs 2 blocks
    with pytest.raises(ValueError, match="at most 5"):
        buffers.fill([PagedRow([1], 20, list(range(6)))])
    with pytest.raises(ValueError, match="one token"):
        buffers.fill([PagedRow([1, 2], 3, [3])])
    assert torch.equal(buffers.staging, staged)  # a refused step writes nothing


def test_grouped_decode_attention_equals_masked_grouped_query_attention():
    generator = torch.Generator().manual_seed(0)
    rows, keys, heads, kv_heads, head_dim = 3, 12, 8, 2, 16
    q = torch.randn(rows, 1, heads, head_dim, generator=generator)
    k = torch.randn(rows, keys, kv_heads, head_dim, generator=generator)
    v = torch.randn(rows, keys, kv_heads, head_dim, generator=generator)
    lengths = torch.tensor([12, 5, 1])
    visible = torch.arange(keys) < lengths[:, None]
    additive = torch.zeros(rows, keys).masked_fill(~visible, float("-inf"))[:, None, None]
    expected = grouped_query_attention(q, k, v, mask=visible[:, None, None])
    torch.testing.assert_close(grouped_decode_attention(q, k, v, additive), expected)
