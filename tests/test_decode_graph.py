"""`Engine(decode_graph=...)`: the decode step compiled per batch bucket gives the eager
engine's tokens, pads without touching any real row's K/V, and runs only for decode steps.

Compiling costs seconds per bucket on 2 cores, so one tiny random model's engine (buckets 2
and 4, so that 1 and 3 rows are padded and 5 rows fall back to eager) serves most tests, and
the graphs are compiled with frozen weights but without max-autotune, whose GEMM search
would multiply the compile time (scripts/bench_decode_graph.py compiles with it).
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

import llmengine
import llmengine.runner.flex_inputs as flex_inputs
import llmengine.runner.graphs as graphs_module
import llmengine.runner.paged_flex as paged_flex
import llmengine.runner.prepare as prepare_module
from llmengine.bench.decode_step import random_llama
from llmengine.engine import Engine
from llmengine.model.config import LlamaConfig
from llmengine.model.llama import grouped_query_attention
from llmengine.runner.attention import PagedRow
from llmengine.runner.graphs import buckets_for

TINY = LlamaConfig.from_dict(
    {
        "model_type": "llama",
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
    },
    source="TINY",
)
# A pool cramped enough for preemption (swap first, recompute when the host space is full),
# with prefix caching on: everything the graph shares the cache tensors with.
POOL = {
    "num_blocks": 12,
    "block_size": 4,
    "num_slots": 5,
    "preemption": "swap",
    "swap_blocks": 4,
    "enable_prefix_caching": True,
}


def quick_graphs() -> pytest.MonkeyPatch:
    """Compile without GEMM autotuning: these tests count graph uses and compare tokens, not
    speed (buckets named outright are kept whatever their speed)."""
    patch = pytest.MonkeyPatch()
    patch.setattr(graphs_module, "CPU_OPTIONS", {"freezing": True})
    return patch


@pytest.fixture(scope="module")
def tiny() -> llmengine.Llama:
    return random_llama(TINY, seed=3, std=0.2)


@pytest.fixture(scope="module")
def graph_engine(tiny):
    patch = quick_graphs()
    try:
        return Engine(tiny, decode_graph=(2, 4), **POOL)
    finally:
        patch.undo()


def workload(seed: int, count: int) -> tuple[list[list[int]], list[llmengine.SamplingParams]]:
    """Prompts of different lengths and budgets, so the batch shrinks across buckets; one
    seeded request samples, the rest are greedy."""
    generator = torch.Generator().manual_seed(seed)
    prompts = [
        torch.randint(0, TINY.vocab_size, (int(length),), generator=generator).tolist()
        for length in torch.randint(1, 9, (count,), generator=generator)
    ]
    params = [
        llmengine.SamplingParams(max_tokens=4 + 3 * index, ignore_eos=True)
        for index in range(count)
    ]
    params[1] = llmengine.SamplingParams(max_tokens=9, temperature=0.8, seed=7, ignore_eos=True)
    return prompts, params


def run(engine: Engine, prompts, params) -> tuple[list[list[int]], list[int], int]:
    """Outputs, whether each step used the graph (1) or not (0), and the preemptions."""
    ids = engine.add_requests(prompts, params)
    used, preempted = [], 0
    while engine.has_unfinished():
        before = engine.runner.graph_steps
        outcome = engine.step()
        engine.check_integrity()
        used.append(engine.runner.graph_steps - before)
        preempted += len(outcome.evicted)
        # The graph ran exactly when every row was a decode and some bucket held them, and
        # the outcome says so, or why not.
        decode_only = outcome.prefill_rows == 0 and outcome.rows <= 4
        assert used[-1] == (decode_only and engine.runner.graphs is not None)
        if engine.runner.graphs is None:
            assert outcome.forward == "eager"
        elif used[-1]:
            assert outcome.forward == "decode_graph"
        else:
            why = "eager_prefill" if outcome.prefill_rows else "eager_no_bucket"
            assert outcome.forward == why
    return [engine.release(i).output_token_ids for i in ids], used, preempted


def test_graph_engine_generates_the_eager_tokens(tiny, graph_engine):
    prompts, params = workload(seed=0, count=5)
    eager, _, _ = run(Engine(tiny, **POOL), prompts, params)
    graph, used, preempted = run(graph_engine, prompts, params)
    assert graph_engine.runner.graphs.direct_buckets == [2, 4]  # past dynamo, every step
    assert graph == eager
    assert sum(used) > 0 and 0 in used  # graph steps and eager (prefill, 5-row) steps
    assert preempted > 0  # the cramped pool preempted someone


def test_a_pool_narrower_than_the_warm_up_rows_builds_its_graph(tiny):
    """The graphs compile on rows of four blocks; a pool of two must still build its graph
    (warm-up rows as wide as the pool) and give the eager tokens."""
    pool = {"num_blocks": 2, "block_size": 4, "num_slots": 2}
    prompts = [[5, 6, 7], [8, 9]]
    params = llmengine.SamplingParams(max_tokens=3, ignore_eos=True)
    patch = quick_graphs()
    try:
        engine = Engine(tiny, decode_graph=(2,), **pool)
    finally:
        patch.undo()
    assert engine.generate(prompts, params) == Engine(tiny, **pool).generate(prompts, params)
    assert engine.runner.graph_steps > 0


def test_graph_runs_only_for_decode_steps_and_never_recompiles(graph_engine):
    graphs = counters["stats"]["unique_graphs"]
    prompts, params = workload(seed=1, count=2)
    _, used, _ = run(graph_engine, prompts, params)
    assert used[0] == 0 and sum(used) > 0  # the first step prefills
    # Every step reads a different number of keys; the inputs' shapes do not change.
    assert counters["stats"]["unique_graphs"] == graphs


def test_a_row_whose_inputs_fail_leaves_the_graph_step_to_the_others(
    tiny, graph_engine, monkeypatch
):
    """One request's row cannot be prepared in a decode step of four rows: the graph of
    bucket 4 runs the three others, who get the eager engine's tokens, and that request
    alone fails."""
    prompts, params = workload(seed=2, count=4)
    eager, _, _ = run(Engine(tiny, **POOL), prompts, params)
    ids = graph_engine.add_requests(prompts, params)
    real = prepare_module.paged_row

    def paged_row(row):  # request ids[2] at its second token, a decode of all four
        if row.request.request_id == ids[2] and row.request.num_output_tokens == 1:
            raise RuntimeError("poisoned")
        return real(row)

    monkeypatch.setattr(prepare_module, "paged_row", paged_row)
    failed = {}
    while graph_engine.has_unfinished():
        outcome = graph_engine.step()
        graph_engine.check_integrity()
        if outcome.failed:
            assert outcome.forward == "decode_graph" and outcome.rows == 3
        failed.update(outcome.failed)
    outputs = [graph_engine.release(i).output_token_ids for i in ids]
    assert failed == {ids[2]: "preparing its inputs failed: poisoned"}
    assert outputs[2] == eager[2][:1]
    assert outputs[:2] + outputs[3:] == eager[:2] + eager[3:]
    assert graph_engine.num_free_blocks == graph_engine.num_blocks


def test_padding_rows_never_touch_real_rows(graph_engine):
    engine = graph_engine
    cache, graphs = engine.runner.cache, engine.runner.graphs
    for tensor in cache.keys + cache.values:
        tensor.normal_(generator=torch.Generator().manual_seed(0))
    before = [tensor.clone() for tensor in cache.keys + cache.values]
    row = PagedRow([5], 6, [3, 7])  # position 6: block 7, offset 2
    with torch.inference_mode():
        logits = graphs([row], bucket=4)  # three padding rows
    assert logits.shape == (1, TINY.vocab_size)
    scratch = engine.num_blocks  # the block beyond the pool
    for old, new in zip(before, cache.keys + cache.values, strict=True):
        changed = (old != new).flatten(2).any(-1).nonzero().tolist()
        assert [tuple(c) for c in changed if c[0] != scratch] == [(7, 2)]


def test_decode_inputs_pad_into_the_scratch_slot():
    rows = [PagedRow([9], 5, [2, 4]), PagedRow([8], 3, [6])]
    buffers = flex_inputs.DecodeInputBuffers(4, num_blocks=11, block_size=4, scratch_block=10)
    buffers.fill([PagedRow([1], 40, [5] * 11)] * 4)  # what an earlier step left is overwritten
    tokens, positions, write, mask_tensors = buffers.fill(rows)
    assert tokens.tolist() == [9, 8, 0, 0]
    assert positions.tolist() == [5, 3, 0, 0]
    assert write.tolist() == [17, 27, 40, 40]
    partial_blocks, partial_tables, full_blocks, tables, ends, places = mask_tensors
    assert tables.shape == (4, 11)  # as wide as the cache, whatever the rows' lengths
    assert tables[:, 0].tolist() == [2, 6, 10, 10] and tables[0, 1].item() == 4
    # Row 0 sees positions 0-5: block 2 whole, two slots of block 4. Row 1 sees block 6 whole.
    assert full_blocks.tolist() == [1, 1, 0, 0]
    assert partial_blocks.tolist() == [1, 0, 1, 1]
    assert partial_tables[:, 0].tolist()[::2] == [4, 10] and ends.tolist() == [6, 4, 1, 1]
    assert places[0, [2, 4, 6]].tolist() == [0, 1, -1] and places[1, 6].item() == 0
    assert (places[2:, 10] == 0).all() and (places >= 0).sum().item() == 5


def test_a_row_whose_graph_logits_are_not_finite_fails_alone(tiny, graph_engine):
    """The graph's own finite check (its greedy picks): a row whose cached keys hold a NaN
    gets NaN logits in a decode-graph step and fails alone; the other row's tokens are the
    ones it has without the NaN."""
    prompts = [[5, 9, 13, 2], [7, 1, 8]]
    params = llmengine.SamplingParams(max_tokens=6, ignore_eos=True)
    expected = Engine(tiny, **POOL).generate(prompts, params)
    first, second = graph_engine.add_requests(prompts, [params] * 2)
    graph_engine.step()  # both prefills
    block = graph_engine.request(second).block_table.block_ids[0]
    graph_engine.runner.cache.keys[0][block] = float("nan")
    failed: dict[int, str] = {}
    while graph_engine.has_unfinished():
        outcome = graph_engine.step()
        assert outcome.forward == "decode_graph"
        failed.update(outcome.failed)
    assert list(failed) == [second] and "not finite" in failed[second]
    assert graph_engine.release(first).output_token_ids == expected[0]
    assert graph_engine.release(second).output_token_ids == expected[1][:1]
    graph_engine.check_integrity()


def test_two_engines_of_the_same_shapes_run_their_own_graphs(tiny):
    """A warm bucket's call checks only the guards that tell graphs apart: two engines whose
    graphs have the same shapes and different weights still each run their own."""
    other = random_llama(TINY, seed=4, std=0.2)
    prompts = [[5, 9, 13, 2], [7, 1, 8]]
    params = llmengine.SamplingParams(max_tokens=8, ignore_eos=True)
    patch = quick_graphs()
    try:
        engines = [Engine(m, num_blocks=16, num_slots=2, decode_graph=(2,)) for m in (tiny, other)]
    finally:
        patch.undo()
    outputs = [engine.generate(prompts, params) for engine in engines]
    assert outputs[0] != outputs[1]
    for model, engine, output in zip((tiny, other), engines, outputs, strict=True):
        assert output == Engine(model, num_blocks=16, num_slots=2).generate(prompts, params)
        assert engine.runner.graph_steps > 0


def test_a_graph_called_past_dynamo_computes_what_dynamo_calls(graph_engine):
    """Rows in the bucket's own buffers take the compiled function directly; the same rows
    in other tensors go through dynamo's call: the logits, the picks and the K/V written
    are the same."""
    graphs, cache = graph_engine.runner.graphs, graph_engine.runner.cache
    rows = [PagedRow([17], 6, [3, 7]), PagedRow([4], 2, [9])]
    other = flex_inputs.DecodeInputBuffers(2, cache.num_blocks, cache.block_size, 12)
    saved = [tensor.clone() for tensor in cache.keys + cache.values]  # the prefix cache's K/V
    results = []
    try:
        for inputs in (graphs.inputs_for(rows, 2), other.fill(rows)):
            for tensor in cache.keys + cache.values:
                tensor.zero_()
            with torch.inference_mode():
                logits = graphs(rows, 2, inputs).clone()
            written = [tensor.clone() for tensor in cache.keys + cache.values]
            results.append((logits, graphs.greedy_picks.clone(), written))
    finally:
        for tensor, before in zip(cache.keys + cache.values, saved, strict=True):
            tensor.copy_(before)
    (direct, direct_picks, direct_kv), (dynamo, dynamo_picks, dynamo_kv) = results
    torch.testing.assert_close(direct, dynamo)
    assert direct_picks.tolist() == dynamo_picks.tolist()
    assert all(torch.equal(a, b) for a, b in zip(direct_kv, dynamo_kv, strict=True))
    assert any(tensor.abs().sum() > 0 for tensor in direct_kv)


def test_a_new_thread_count_compiles_the_graph_again_before_it_is_called_directly(tiny):
    """Inductor's CPU kernels are written for the thread count they were compiled at, so the
    direct calls are kept per thread count: at a new count the first step goes through
    dynamo, which compiles again, and the tokens stay the eager engine's."""
    prompts = [[5, 9, 13, 2], [7, 1, 8]]
    params = llmengine.SamplingParams(max_tokens=6, ignore_eos=True)
    expected = Engine(tiny, num_blocks=16, num_slots=2).generate(prompts, params)
    threads = torch.get_num_threads()
    patch = quick_graphs()
    try:
        torch.set_num_threads(1)
        engine = Engine(tiny, num_blocks=16, num_slots=2, decode_graph=(2,))
        assert engine.runner.graphs.direct_buckets == [2]
        torch.set_num_threads(2)
        assert engine.runner.graphs.direct_buckets == []
        assert engine.generate(prompts, params) == expected
        assert engine.runner.graphs.direct_buckets == [2]
    finally:
        torch.set_num_threads(threads)
        patch.undo()


def test_decode_inputs_are_written_into_the_same_tensors_every_step(graph_engine):
    graphs = graph_engine.runner.graphs
    first = graphs.inputs_for([PagedRow([3], 2, [1])], 2)
    second = graphs.inputs_for([PagedRow([4], 9, [5, 6, 7]), PagedRow([5], 0, [2])], 2)
    assert all(a is b for a, b in zip(first[:3], second[:3], strict=True))
    assert all(a is b for a, b in zip(first[3], second[3], strict=True))
    assert second[0].tolist() == [4, 5] and second[1].tolist() == [9, 0]
    with pytest.raises(ValueError, match="needs 3 blocks"):
        graphs.inputs_for([PagedRow([4], 9, [5, 6])], 2)


@pytest.mark.parametrize("heads", [2, 4, 8])
def test_paged_decode_attention_reads_the_gathered_keys(heads):
    """The in-place read through the block mask equals attention over keys copied out
    position by position (what the eager forward does), for rows ending mid-block and on a
    block boundary, sharing no block; with one query head per K/V head, and with 2 and 4
    sharing one (each group the mask's query positions)."""
    generator = torch.Generator().manual_seed(0)
    block_size, num_blocks, kv_heads, head_dim = 4, 9, 2, 16
    keys = torch.randn(num_blocks * block_size, kv_heads, head_dim, generator=generator)
    values = torch.randn(keys.shape, generator=generator)
    tables = torch.tensor([[5, 1, 7, 0, 0, 0, 0, 0, 0], [2, 8, 0, 0, 0, 0, 0, 0, 0]])
    ends = torch.tensor([10, 8])
    q = torch.randn(2, 1, heads, head_dim, generator=generator)

    def in_place(q, mask_tensors, keys, values):
        group = q.shape[2] // keys.shape[1]
        block_mask = paged_flex.paged_block_mask(mask_tensors, keys.shape[0], group)
        return paged_flex.paged_decode_attention(q, keys, values, block_mask)

    tensors = flex_inputs.block_mask_tensors(ends, tables, block_size)
    out = torch.compile(in_place, fullgraph=True)(q, tensors, keys, values)
    for row, end in enumerate(ends.tolist()):
        slots = [
            int(tables[row, p // block_size]) * block_size + p % block_size for p in range(end)
        ]
        expected = grouped_query_attention(q[row : row + 1], keys[None, slots], values[None, slots])
        torch.testing.assert_close(out[row : row + 1], expected)


def test_buckets_cover_the_slots():
    assert buckets_for(1) == [1]
    assert buckets_for(8) == [1, 2, 4, 8]
    assert buckets_for(5) == [1, 2, 4, 8]
    assert buckets_for(40) == [1, 2, 4, 8, 16, 32, 40]


def test_embedded_model_graph_gives_the_eager_tokens(model):
    prompts = [[1, 5, 9, 13, 2, 7][: 2 + index] for index in range(3)]
    params = llmengine.SamplingParams(max_tokens=10, ignore_eos=True)
    eager = Engine(model, num_blocks=16, num_slots=2).generate(prompts, params)
    patch = quick_graphs()
    try:
        engine = Engine(model, num_blocks=16, num_slots=2, decode_graph=(2,))
    finally:
        patch.undo()
    assert engine.runner.graph_compile_seconds > 0
    assert engine.generate(prompts, params) == eager
    assert engine.runner.graph_steps > 0


def test_cli_takes_decode_graph_on_generate_serve_and_bench():
    from llmengine.cli import build_parser

    parser = build_parser()
    bench = ["bench", "--requests", "2", "--prompt-len", "3", "--max-tokens", "2"]
    for argv in (["generate", "--prompt", "x"], ["serve"], bench):
        assert parser.parse_args([*argv, "--decode-graph"]).decode_graph is True
        # Left out, it is off: False, or None where the command tells given from not.
        assert not parser.parse_args(argv).decode_graph


def test_rows_with_drafts_run_eager_and_say_so(tiny):
    """Prompt lookup on a graph engine: a step whose decode rows carry drafts computes
    several positions a row, which no graph takes; the text is still the eager engine's."""
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], [9, 8, 9, 8, 9]]
    params = llmengine.SamplingParams(max_tokens=12, ignore_eos=True)
    pool = {"num_blocks": 24, "block_size": 4, "num_slots": 2}
    eager = Engine(tiny, **pool).generate(prompts, params)
    patch = quick_graphs()
    try:
        engine = Engine(tiny, decode_graph=(2,), speculative="ngram", **pool)
    finally:
        patch.undo()
    ids = engine.add_requests(prompts, params)
    paths = set()
    while engine.has_unfinished():
        outcome = engine.step()
        paths.add(outcome.forward)
        assert (outcome.forward == "eager_drafts") == (outcome.num_draft_tokens > 0)
    assert [engine.release(i).output_token_ids for i in ids] == eager
    assert {"eager_prefill", "eager_drafts"} <= paths
