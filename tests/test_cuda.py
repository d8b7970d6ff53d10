"""The same engine on a GPU: the model, the engine and the server on CUDA agree with the CPU.

Skipped without a CUDA device (CI has none); `scripts/check_cuda.sh` runs them on one.
float32 on the GPU is held to the CPU's tolerances against transformers; bfloat16 only to
its own uncached forward, since its rounding differs from float32's everywhere.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from engine_runs import prompts_for
from hf_llama import greedy, hf_greedy, save_random_llama
from server_helpers import MODEL_NAME
from test_model_parity import CASES, assert_same_logits, random_ids

import llmengine
from llmengine.bench.decode_step import random_llama
from llmengine.bench.http_client import run_over_http
from llmengine.bench.workloads import uniform_burst
from llmengine.engine_config import EngineConfig
from llmengine.lessons.live_server import live_server
from llmengine.model.config import LlamaConfig
from llmengine.runner.attention import PagedRow
from llmengine.runner.cuda_graphs import StaticDecodeGraphs
from llmengine.runner.model_runner import paged_cache_for

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

GREEDY = llmengine.SamplingParams(max_tokens=16)
SEEDED = llmengine.SamplingParams(
    max_tokens=16, temperature=0.9, top_k=40, top_p=0.9, seed=7, ignore_eos=True
)


# The attention shape whose flex-decoding lowering found no kernel (32 query heads over 8 K/V
# heads, head dim 64) in two layers; weights wide enough apart that greedy has no near-ties.
GRAPH_SHAPE = LlamaConfig.from_dict(
    {
        "model_type": "llama",
        "vocab_size": 4096,
        "hidden_size": 2048,
        "intermediate_size": 4096,
        "num_hidden_layers": 2,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 1024,
    },
    source="GRAPH_SHAPE",
)
GRAPH_POOL = {"num_blocks": 512, "block_size": 16, "num_slots": 64}
BUCKETS = (1, 8, 64)


@pytest.fixture(scope="module")
def cuda_model() -> llmengine.Llama:
    """The embedded model on the GPU, float32."""
    return llmengine.load_model(device="cuda")


def engine_on(model: llmengine.Llama, **options: object) -> llmengine.Engine:
    return llmengine.Engine(model, num_blocks=64, block_size=16, num_slots=8, **options)


def test_embedded_model_on_cuda_gives_the_cpu_logits(model, cuda_model) -> None:
    ids = random_ids(model.config.vocab_size, (2, 48))
    with torch.no_grad():
        expected = model(ids)
        actual = cuda_model(ids.cuda()).cpu()
    assert (actual - expected).abs().max().item() < 1e-4


@pytest.mark.parametrize("overrides", CASES.values(), ids=CASES.keys())
def test_logits_and_greedy_match_transformers_on_cuda(tmp_path: Path, overrides: dict) -> None:
    hf = save_random_llama(tmp_path, **overrides).cuda()
    model = llmengine.load_model(tmp_path, device="cuda")
    ids = random_ids(hf.config.vocab_size, (2, 48)).cuda()
    assert_same_logits(hf, model, ids)
    prompt = ids[:, :6]
    assert greedy(model, prompt, 16) == hf_greedy(hf, prompt, 16)


def test_the_engine_lives_on_the_model_device(cuda_model) -> None:
    engine = engine_on(cuda_model, preemption="swap", swap_blocks=4)
    assert {
        tensor.device.type for tensor in engine.runner.cache.keys + engine.runner.cache.values
    } == {"cuda"}
    host = engine.runner.cache.host_keys + engine.runner.cache.host_values
    assert all(tensor.device.type == "cpu" and tensor.is_pinned() for tensor in host)


def test_engine_on_cuda_generates_the_cpu_greedy_tokens(model, cuda_model) -> None:
    prompts = prompts_for(0, 6, model.config.vocab_size)
    assert engine_on(cuda_model).generate(prompts, GREEDY) == engine_on(model).generate(
        prompts, GREEDY
    )


def test_compiled_engine_on_cuda_generates_the_eager_tokens(model, cuda_model) -> None:
    prompts = prompts_for(0, 6, model.config.vocab_size)
    compiled = engine_on(cuda_model, compile=True)
    assert compiled.generate(prompts, GREEDY) == engine_on(cuda_model).generate(prompts, GREEDY)


def test_seeded_sampling_on_cuda_repeats(cuda_model) -> None:
    """Each seeded request draws from a generator on the GPU, and the same seed repeats."""
    prompts = prompts_for(1, 4, cuda_model.config.vocab_size)
    first = engine_on(cuda_model).generate(prompts, SEEDED)
    assert engine_on(cuda_model).generate(prompts, SEEDED) == first
    assert all(len(tokens) == SEEDED.max_tokens for tokens in first)


def test_bfloat16_engine_matches_its_uncached_greedy() -> None:
    model = llmengine.load_model(device="cuda", dtype=torch.bfloat16)
    engine = engine_on(model)
    assert engine.runner.cache.keys[0].dtype == torch.bfloat16
    prompt = prompts_for(2, 1, model.config.vocab_size)[0]
    steps = 8
    params = llmengine.SamplingParams(max_tokens=steps, ignore_eos=True)
    (tokens,) = engine.generate([prompt], params)
    assert tokens == greedy(model, torch.tensor([prompt], device="cuda"), steps)[0]


def test_server_on_cuda_returns_the_cpu_engine_texts(model, tokenizer) -> None:
    burst = uniform_burst(8, 16, 16, vocab_size=1000, seed=3)
    prompts = [list(spec.prompt_token_ids) for spec in burst]
    outputs = engine_on(model).generate(prompts, burst[0].params)
    expected = [tokenizer.decode(tokens, skip_special_tokens=True) for tokens in outputs]
    options = ["--device", "cuda", "--served-model-name", MODEL_NAME, "--num-blocks", "64"]
    with live_server(options) as server:
        run = run_over_http(server.api, MODEL_NAME, burst)
    assert [record.error for record in run.records] == [None] * len(burst)
    assert [record.text for record in run.records] == expected
    assert server.exit_code == [0]


@pytest.fixture(scope="module")
def graph_model() -> llmengine.Llama:
    """The small random model of the decode graph tests, float32 on the GPU."""
    return random_llama(GRAPH_SHAPE, seed=0, std=0.05).cuda()


def graph_workload() -> tuple[list[list[int]], list[llmengine.SamplingParams]]:
    """64 requests whose budgets make the batch shrink through every bucket: 64 rows, then
    8, then 1; one of the 8 samples with a seed."""
    prompts = prompts_for(5, 64, GRAPH_SHAPE.vocab_size, low=4, high=40)
    params = [llmengine.SamplingParams(max_tokens=6, ignore_eos=True)] * 64
    params[1:8] = [llmengine.SamplingParams(max_tokens=16, ignore_eos=True)] * 7
    params[3] = llmengine.SamplingParams(max_tokens=16, temperature=0.8, seed=7, ignore_eos=True)
    params[0] = llmengine.SamplingParams(max_tokens=24, ignore_eos=True)
    return prompts, params


def test_decode_graphs_capture_and_give_the_eager_tokens(graph_model, caplog) -> None:
    """Buckets 1, 8 and 64 capture (their warm-up and capture times logged at start-up),
    decode-only steps of every bucket replay them, and the tokens are the eager engine's."""
    with caplog.at_level(logging.INFO, logger="llmengine.runner"):
        engine = llmengine.Engine(graph_model, decode_graph=BUCKETS, **GRAPH_POOL)
    graphs = engine.runner.graphs
    assert isinstance(graphs, StaticDecodeGraphs)
    assert graphs.failures == {} and graphs.buckets == list(BUCKETS)
    assert all(graphs.capture_seconds[bucket] > 0 for bucket in BUCKETS)
    # Triton comes with CUDA builds of torch: every bucket attends with the paged kernel.
    assert graphs.attention == dict.fromkeys(BUCKETS, "paged"), graphs.paged_failure
    for bucket in BUCKETS:
        assert f"bucket {bucket}: paged attention, warm-up" in caplog.text
    prompts, params = graph_workload()
    ids = engine.add_requests(prompts, params)
    graph_rows = set()
    while engine.has_unfinished():
        outcome = engine.step()
        if outcome.forward == "decode_graph":
            graph_rows.add(graphs.graph_for(outcome.rows))
    outputs = [engine.release(i).output_token_ids for i in ids]
    assert graph_rows == set(BUCKETS)
    assert outputs == llmengine.Engine(graph_model, **GRAPH_POOL).generate(prompts, params)


def test_a_replayed_decode_step_syncs_only_for_its_read_back(graph_model) -> None:
    """Staging eight rows, uploading them and replaying the graph never waits for the GPU
    (any synchronising call raises in the sync debug mode); reading the ids back is the one
    wait, after it."""
    engine = llmengine.Engine(graph_model, decode_graph=(8,), **GRAPH_POOL)
    graphs = engine.runner.graphs
    assert graphs.buffers[8].staging.is_pinned()  # what lets the upload skip a sync
    rows = [PagedRow([row], 17 + row, [2 * row, 2 * row + 1]) for row in range(8)]
    with torch.inference_mode():
        graphs(rows, 8)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            ids = graphs(rows, 8, graphs.inputs_for(rows, 8)).argmax(dim=-1)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert len(ids.tolist()) == 8


def test_bfloat16_decode_graph_replays_the_uncaptured_step() -> None:
    """In bfloat16 every bucket captures, and a replay gives the logits of the same step run
    eagerly over the same cache, for two different sets of rows in turn: each replay reads
    the inputs uploaded for it, not those it was captured or last replayed with. The paged
    kernel's logits are those of the step that gathers."""
    model = random_llama(GRAPH_SHAPE, seed=1, std=0.05).to("cuda", torch.bfloat16)
    config = EngineConfig(decode_graph=BUCKETS, **GRAPH_POOL)
    cache = paged_cache_for(model, config)
    for tensor in cache.keys + cache.values:
        tensor.normal_()
    captured = StaticDecodeGraphs(model, cache, config.num_blocks, BUCKETS)
    uncaptured = StaticDecodeGraphs(model, cache, config.num_blocks, BUCKETS, capture=False)
    gathering = StaticDecodeGraphs(
        model, cache, config.num_blocks, BUCKETS, capture=False, attention="gathered"
    )
    assert captured.failures == {} and captured.buckets == list(BUCKETS)
    first = [PagedRow([row], 5 * row + 3, [3 * row, 3 * row + 1, 3 * row + 2]) for row in range(6)]
    second = [
        PagedRow([100 + row], 40 + row, [20 + 3 * row + b for b in range(3)]) for row in range(6)
    ]
    with torch.inference_mode():
        replayed = [captured(rows, 8).clone() for rows in (first, second)]
        expected = [uncaptured(rows, 8).clone() for rows in (first, second)]
        gathered = [gathering(rows, 8) for rows in (first, second)]
    for actual, wanted in zip(replayed, expected, strict=True):
        torch.testing.assert_close(actual, wanted, atol=5e-2, rtol=2e-2)
    for paged, wanted in zip(expected, gathered, strict=True):  # the two attentions agree
        torch.testing.assert_close(paged, wanted, atol=5e-2, rtol=2e-2)
    assert not torch.allclose(replayed[0], replayed[1], atol=5e-2, rtol=2e-2)


def test_the_paged_kernel_compiled_for_the_gpu_equals_gathered_attention() -> None:
    """tests/paged_decode_interpreted.py's shapes and dtypes, compiled by Triton for this
    GPU instead of interpreted."""
    from paged_decode_interpreted import check_numbers

    check_numbers("cuda")


def test_gathered_attention_on_cuda_runs_no_cudnn_op() -> None:
    """cuDNN plans SDPA anew for every key length; the engine's steps must never reach it.

    bfloat16 (cuDNN's attention takes no float32), prompts of different lengths (so the
    decode steps attend through a mask) and a uniform pair (no mask): every op of the
    profiled steps, on the host and the device, is named without "cudnn".
    """
    model = llmengine.load_model(device="cuda", dtype=torch.bfloat16)
    params = llmengine.SamplingParams(max_tokens=6, ignore_eos=True)
    uneven = prompts_for(4, 4, model.config.vocab_size)
    even = [[7] * 12, [9] * 12]
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profile:
        for prompts in (uneven, even):
            engine_on(model).generate(prompts, params)
    names = {event.key for event in profile.key_averages()}
    assert any("attention" in name for name in names), "the profile holds no attention op"
    assert not [name for name in names if "cudnn" in name.lower()]
