"""Tensor parallelism over torch.distributed (gloo, two processes on 127.0.0.1): each rank
holds its slice, one scheduler decides, and the text is the single process's."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
from hf_llama import save_random_llama, save_word_level_tokenizer
from safetensors import safe_open

import llmengine
from llmengine.bench.http_client import free_port, wait_for_health
from llmengine.cli import main
from llmengine.model.config import LlamaConfig
from llmengine.model.sharding import Shard, local_config, read_shard, split_dim
from llmengine.parallel.cluster import Cluster
from llmengine.parallel.engine import start_tensor_parallel
from llmengine.speculative.draft import save_self_draft

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], list(range(10, 40)), [5] * 9]
RUN = {"kernels": "eager", "timeout_s": 30.0}


WORDS = [f"w{index}" for index in range(256)]


@pytest.fixture(scope="module")
def gqa_untied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tp-gqa-untied")
    save_random_llama(folder, vocab_size=256, attention_bias=True, mlp_bias=True)
    save_word_level_tokenizer(folder, WORDS)
    return folder


@pytest.fixture(scope="module")
def gqa_tied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tp-gqa-tied")
    save_random_llama(folder, seed=1, vocab_size=256, tie_word_embeddings=True)
    save_word_level_tokenizer(folder, WORDS)
    return folder


def single_process(folder: Path, prompts: list[list[int]], params: Any, **options: Any) -> list:
    engine = llmengine.Engine(llmengine.load_model(folder, kernels="eager"), **options)
    return engine.generate(prompts, params)


def two_ranks(folder: Path, prompts: list[list[int]], params: Any, **options: Any) -> list:
    with start_tensor_parallel(folder, tensor_parallel_size=2, **RUN, **options) as engine:
        tokens = engine.generate(prompts, params)
        engine.check_integrity()
        return tokens


def test_each_rank_reads_its_slice_and_the_slices_make_the_whole(gqa_untied: Path) -> None:
    with safe_open(gqa_untied / "model.safetensors", framework="pt") as handle:
        for name in sorted(handle.keys()):
            parts = [read_shard(handle, name, Shard(rank, 2)) for rank in range(2)]
            whole = handle.get_tensor(name)
            dim = split_dim(name)
            if dim is not None:
                assert torch.equal(torch.cat(parts, dim=dim), whole), name
            elif name.endswith(("o_proj.bias", "down_proj.bias")):
                assert torch.equal(parts[0], whole) and not parts[1].any(), name
            else:
                assert torch.equal(parts[0], whole) and torch.equal(parts[1], whole), name


def test_a_size_that_does_not_divide_the_heads_is_refused(gqa_untied: Path) -> None:
    config = LlamaConfig.from_file(gqa_untied / "config.json")
    assert local_config(config, 2).num_key_value_heads == config.num_key_value_heads // 2
    with pytest.raises(ValueError, match="does not divide num_key_value_heads"):
        local_config(config, 4)
    with pytest.raises(ValueError, match="does not divide num_attention_heads=4"):
        start_tensor_parallel(gqa_untied, tensor_parallel_size=3, num_blocks=8)


@pytest.mark.parametrize("checkpoint", ["gqa_untied", "gqa_tied"])
def test_greedy_text_at_two_ranks_is_the_single_process_text(
    checkpoint: str, request: pytest.FixtureRequest
) -> None:
    folder = request.getfixturevalue(checkpoint)
    params = llmengine.SamplingParams(max_tokens=16, ignore_eos=True)
    pool = {"num_blocks": 32, "block_size": 4, "num_slots": 4}
    assert two_ranks(folder, PROMPTS, params, **pool) == single_process(
        folder, PROMPTS, params, **pool
    )


@pytest.mark.parametrize("checkpoint", ["gqa_untied", "gqa_tied"])
def test_generate_prints_the_same_text_with_two_ranks(
    checkpoint: str, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = request.getfixturevalue(checkpoint)
    argv = ["generate", "--model", str(folder), "--prompt", "w3 w1 w4 w1 w5"]
    argv += ["--max-tokens", "24", "--temperature", "0", "--ignore-eos", "--kernels", "eager"]
    assert main(argv) == 0
    alone = capsys.readouterr().out
    assert main([*argv, "--tensor-parallel-size", "2"]) == 0
    assert capsys.readouterr().out == alone and len(alone.split()) == 24


def test_seeds_caching_chunking_and_swap_work_unchanged_across_ranks(gqa_untied: Path) -> None:
    """A cramped pool preempting by swap, prefix caching on, prefills chunked, seeded
    sampling: the two ranks follow rank 0's every decision and the tokens match."""
    shared = [3, 1, 4, 1, 5, 9, 2, 6]
    prompts = [shared + prompt for prompt in PROMPTS]
    params = [
        llmengine.SamplingParams(max_tokens=20, temperature=0.8, seed=seed, ignore_eos=True)
        for seed in range(len(prompts))
    ]
    options = {
        "num_blocks": 24, "block_size": 4, "num_slots": 4, "preemption": "swap",
        "swap_blocks": 8, "enable_prefix_caching": True, "max_num_batched_tokens": 16,
    }  # fmt: skip
    alone = llmengine.Engine(llmengine.load_model(gqa_untied, kernels="eager"), **options)
    ids = alone.add_requests(prompts, params)
    outcomes = []
    while alone.has_unfinished():
        outcomes.append(alone.step())
    # The run exercises what it claims to: swaps, a recompute, cache hits, chunks.
    swapped = sum(len(outcome.swapped_out) for outcome in outcomes)
    assert 0 < swapped < sum(len(outcome.evicted) for outcome in outcomes)
    assert sum(outcome.cached_tokens for outcome in outcomes) > 0
    assert max(outcome.forward_tokens for outcome in outcomes) == 16
    expected = [alone.release(request_id).output_token_ids for request_id in ids]
    assert two_ranks(gqa_untied, prompts, params, **options) == expected


def test_speculation_compiling_and_decode_graphs_keep_the_text_across_ranks(
    gqa_untied: Path, tmp_path: Path
) -> None:
    """Every rank runs the same model runner: drafts by prompt lookup ride on the rows every
    rank computes, a draft model guesses whole on rank 0 before the plan goes out, and the
    compiled halves and decode graphs run the all-reduces inside them."""
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [5, 6, 5, 6, 5]]
    greedy = llmengine.SamplingParams(max_tokens=16, ignore_eos=True)
    options = {"num_blocks": 32, "block_size": 4, "num_slots": 2}
    expected = single_process(gqa_untied, prompts, greedy, **options)
    draft = save_self_draft(gqa_untied, tmp_path / "draft", num_layers=1)
    for extra in (
        {"speculative": "ngram", "num_speculative_tokens": 3},
        {"speculative": str(draft), "num_speculative_tokens": 2},
        {"compile": True},
        {"decode_graph": (1, 2)},
    ):
        with start_tensor_parallel(gqa_untied, tensor_parallel_size=2, **RUN, **options,
                                   **extra) as engine:  # fmt: skip
            assert engine.generate(prompts, greedy) == expected, extra
            if "decode_graph" in extra:
                assert engine.runner.graph_steps > 0


def test_a_rank_that_dies_makes_the_engine_raise_in_bounded_time(gqa_untied: Path) -> None:
    params = llmengine.SamplingParams(max_tokens=8, ignore_eos=True)
    engine = start_tensor_parallel(
        gqa_untied, tensor_parallel_size=2, kernels="eager", timeout_s=10.0, num_blocks=16
    )
    try:
        engine.add_request(PROMPTS[0], params)
        engine.step()
        engine.workers[0].kill()
        engine.workers[0].join(10)
        start = time.monotonic()
        with pytest.raises(RuntimeError, match="tensor-parallel rank"):
            while engine.has_unfinished():
                engine.step()
        assert time.monotonic() - start < 30
    finally:
        engine.close()
    assert not any(worker.is_alive() for worker in engine.workers)


def test_serve_with_two_ranks_answers_the_openai_client_and_exits_cleanly() -> None:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "llmengine", "serve", "--port", str(port)]
    command += ["--num-blocks", "32", "--served-model-name", "bard", "--kernels", "eager"]
    greedy = {"model": "bard", "prompt": "ROMEO:", "max_tokens": 8, "temperature": 0}
    reference = llmengine.Engine(
        llmengine.load_model(kernels="eager"), tokenizer=llmengine.load_tokenizer(), num_blocks=32
    )
    expected = reference.generate_text(["ROMEO:"], llmengine.SamplingParams(max_tokens=8))
    server = subprocess.Popen(
        [*command, "--tensor-parallel-size", "2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for_health(f"http://127.0.0.1:{port}", server, timeout=90)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", timeout=30)
        completion = client.completions.create(**greedy)
        assert completion.choices[0].text == expected[0]
        server.send_signal(signal.SIGTERM)
        output, _ = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)
    assert server.returncode == 0, output
    # No rank outlives the server: its process group empties (the worker and multiprocessing's
    # resource tracker leave right after the server does).
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            os.killpg(server.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.killpg(server.pid, signal.SIGKILL)
    raise AssertionError("a process of the server's group outlived it")


def test_bench_sweeps_pools_on_two_ranks_with_the_single_process_numbers(
    gqa_untied: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "--model", str(gqa_untied), "--requests", "4", "--prompt-len", "5"]
    argv += ["--max-tokens", "12", "--slots", "4", "--block-size", "4", "--pools", "16,8"]
    argv += ["--kernels", "eager", "--format", "json"]
    assert main(argv) == 0
    alone = json.loads(capsys.readouterr().out)
    assert main([*argv, "--tensor-parallel-size", "2"]) == 0
    ranks = json.loads(capsys.readouterr().out)
    deterministic = ("iterations", "preemptions", "forward_tokens", "recomputed_tokens")
    for one, two in zip(alone, ranks, strict=True):
        assert {key: one[key] for key in deterministic} == {key: two[key] for key in deterministic}
    assert alone[1]["preemptions"] > 0  # the small pool preempts, on both


def test_two_nodes_meet_at_node_0s_address_and_print_the_same_text(
    gqa_untied: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Node 1 is a second `llmengine generate` process, as on another machine; both meet at
    127.0.0.1 here, as they would at node 0's address on a network."""
    argv = ["generate", "--model", str(gqa_untied), "--prompt", "w2 w7 w1 w8"]
    argv += ["--max-tokens", "24", "--temperature", "0", "--ignore-eos", "--kernels", "eager"]
    assert main(argv) == 0
    alone = capsys.readouterr().out
    nodes = ["--tensor-parallel-size", "2", "--nnodes", "2", "--master-addr", "127.0.0.1"]
    nodes += ["--master-port", str(free_port())]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    node_1 = subprocess.Popen(
        [sys.executable, "-m", "llmengine", *argv, *nodes, "--node-rank", "1"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert main([*argv, *nodes, "--node-rank", "0"]) == 0
        assert capsys.readouterr().out == alone
        output, _ = node_1.communicate(timeout=30)
    finally:
        if node_1.poll() is None:
            node_1.kill()
            node_1.wait(10)
    assert node_1.returncode == 0 and output == "", output


def test_the_cluster_comes_from_flags_or_torchruns_environment() -> None:
    torchrun = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "GROUP_RANK": "1",
                "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}  # fmt: skip
    cluster = Cluster.of(4, environment=torchrun)
    assert (cluster.nnodes, cluster.node_rank, cluster.init_method) == (
        2, 1, "tcp://10.0.0.1:29500",
    )  # fmt: skip
    assert list(cluster.local_ranks) == [2, 3]
    assert Cluster.of(4, node_rank=0, master_port=1234, environment=torchrun).node_rank == 0
    assert Cluster.of(2, environment={}).with_port().master_port > 0
    with pytest.raises(ValueError, match="must divide"):
        Cluster(4, nnodes=3, master_port=1)
    with pytest.raises(ValueError, match="need --master-port"):
        Cluster(4, nnodes=2)
    with pytest.raises(ValueError, match="--node-rank"):
        Cluster(4, nnodes=2, node_rank=2, master_port=1)
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        main(["generate", "--prompt", "x", "--nnodes", "0"])
    assert main(["generate", "--prompt", "x", "--nnodes", "2"]) == 2  # without a size above 1


def test_a_rank_that_hangs_makes_the_engine_raise_after_the_timeout(gqa_untied: Path) -> None:
    params = llmengine.SamplingParams(max_tokens=8, ignore_eos=True)
    engine = start_tensor_parallel(
        gqa_untied, tensor_parallel_size=2, kernels="eager", timeout_s=3.0, num_blocks=16
    )
    try:
        engine.add_request(PROMPTS[0], params)
        engine.step()
        os.kill(engine.workers[0].pid, signal.SIGSTOP)  # alive, but answers nothing
        start = time.monotonic()
        with pytest.raises(RuntimeError, match="tensor-parallel rank"):
            engine.step()
        assert 2.5 < time.monotonic() - start < 30
    finally:
        engine.close()
    assert not any(worker.is_alive() for worker in engine.workers)


def test_workers_take_the_starting_process_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """A spawned rank would start on torch's default thread count; it is handed this one."""
    from llmengine.parallel import engine as parallel_engine

    started: list[tuple] = []

    class Recorded:
        def __init__(self, target: Any, args: tuple, daemon: bool) -> None:
            started.append(args)

        def start(self) -> None:
            pass

    class Context:
        Process = Recorded

    monkeypatch.setattr(parallel_engine.mp, "get_context", lambda method: Context)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        parallel_engine._start_workers(Cluster(3), range(1, 3), None, {}, None, 5.0)
    finally:
        torch.set_num_threads(before)
    assert [args[-1] for args in started] == [1, 1]
