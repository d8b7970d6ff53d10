"""A tensor-parallel engine: rank 0 schedules and samples, every rank runs its slice of the step.

`start_tensor_parallel(path, tensor_parallel_size=N, ...)` starts N - 1 worker processes,
joins them in a `torch.distributed` process group (gloo on the CPU) and returns an `Engine`
on rank 0 whose model is rank 0's slice. Every rank has a model runner
(`llmengine.runner.ModelRunner`): rank 0's is the leader, which drafts and samples, and
before each forward broadcasts its `ForwardPlan` (the rows with their block tables, the
swaps, the decode graph's bucket): one scheduler decides, the other ranks follow. Every
rank's runner then runs the same code on its own heads and MLP slice (compiled halves and
decode graphs too), and the two all-reduces of each layer make every rank's hidden state
whole again, so rank 0 samples from the same logits a single process computes. A draft
model runs whole on rank 0, before the plan goes out.

Each rank's paged cache holds its own K/V heads only; block ids mean the same on every rank,
so prefix caching, chunked prefill, preemption (recompute or swap), aborts and seeds work
unchanged. A collective that waits longer than `timeout_s` (a rank that died or hangs)
raises on rank 0 instead of hanging.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from llmengine.engine import Engine
from llmengine.engine_config import EngineConfig
from llmengine.model.config import LlamaConfig
from llmengine.model.llama import Llama
from llmengine.model.loader import model_folder
from llmengine.model.sharding import Shard, check_divisible
from llmengine.parallel.cluster import Cluster
from llmengine.runner.loading import load_model
from llmengine.runner.model_runner import ModelRunner
from llmengine.runner.prepare import ForwardPlan, Inputs

TIMEOUT_S = 60.0  # the longest a collective may wait for a rank before the engine raises
JOIN_TIMEOUT_S = 10.0  # how long `close` waits for a worker to exit before killing it
START_TIMEOUT_S = 300.0  # how long the ranks may take to meet at start-up


def add_all_reduces(model: Llama) -> None:
    """Sum the ranks' partial outputs after each block's row-parallel product: attention's
    output projection and the MLP's down projection, one all-reduce each per layer. As hooks
    on those products, so that every way a layer runs (its own call, its compiled halves, a
    decode graph) runs them."""
    for layer in model.layers:
        layer.self_attn.o_proj.register_forward_hook(_all_reduce_output)
        layer.mlp.down_proj.register_forward_hook(_all_reduce_output)


def _all_reduce_output(module: torch.nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(output)
    return output


def _broadcast(plan: ForwardPlan | None) -> ForwardPlan | None:
    """Rank 0 sends `plan` (None: stop); every other rank receives it."""
    message = [plan]
    dist.broadcast_object_list(message, src=0)
    return message[0]


class LeaderRunner(ModelRunner):
    """Rank 0's model runner: every forward's plan goes to the other ranks first. Its decode
    graphs are never dropped by its own timing: every rank runs the same graph in lockstep."""

    times_graphs_at_start = False
    failed = False

    def execute(self, plan: ForwardPlan, inputs: Inputs | None = None) -> torch.Tensor:
        try:
            _broadcast(plan)
            return super().execute(plan, inputs)
        except RuntimeError as error:
            self.failed = True
            raise RuntimeError(f"a tensor-parallel rank failed or hangs: {error}") from error


class TensorParallelEngine(Engine):
    """The engine on rank 0 of a tensor-parallel group; `close()` stops the other ranks."""

    workers: list[mp.Process]

    runner: LeaderRunner

    def runner_for(self, model: Llama, tokenizer: Any) -> ModelRunner:
        return LeaderRunner(model, self.config, tokenizer=tokenizer)

    @property
    def failed(self) -> bool:
        """A collective failed: the group is broken, the workers are not waited for."""
        return self.runner.failed

    def close(self) -> None:
        """Stop the overlap's thread, if any; tell the workers to stop and wait for them, then
        leave the group; after a failed step, or a worker that does not stop, the workers are
        killed instead."""
        self.runner.close()
        if not dist.is_initialized():
            return
        if not self.failed:
            try:
                _broadcast(None)
            except RuntimeError:
                self.runner.failed = True
        for worker in self.workers:
            worker.join(0 if self.failed else JOIN_TIMEOUT_S)
            if worker.is_alive():
                worker.kill()
                worker.join(JOIN_TIMEOUT_S)
        dist.destroy_process_group()

    def __enter__(self) -> TensorParallelEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def start_tensor_parallel(
    path: str | Path | None,
    *,
    tensor_parallel_size: int | Cluster,
    dtype: str | None = None,
    kernels: str = "measured",
    quantization: str | None = None,
    tokenizer: Any = None,
    timeout_s: float = TIMEOUT_S,
    **options: Any,
) -> TensorParallelEngine:
    """Start this node's other ranks as worker processes and return the engine on rank 0.

    `tensor_parallel_size` is the number of ranks, all on this machine, or a `Cluster` whose
    node 0 this is (the other nodes run `run_worker_node`). `options` are the `EngineConfig`
    fields, the same on every rank. Each rank loads only its slice of the checkpoint at
    `path` (None: the embedded model), in `dtype`, its products prepared with `kernels` and
    `quantization` as `load_model` does, on as many threads as this process uses. Use it as a
    context manager, or call `close()`, so the workers stop.
    """
    cluster = _cluster(tensor_parallel_size)
    if cluster.node_rank != 0:
        raise ValueError("the engine runs on node 0; other nodes call run_worker_node")
    config, load = _checked(path, cluster, options, dtype, kernels, quantization)
    workers = _start_workers(cluster, cluster.local_ranks[1:], path, load, config, timeout_s)
    try:
        _join_group(Shard(0, cluster.size), cluster.init_method, timeout_s)
        model = load_model(path, shard=Shard(0, cluster.size), **load)
        add_all_reduces(model)
        engine = TensorParallelEngine(model, config, tokenizer=tokenizer)
    except BaseException:
        for worker in workers:
            worker.kill()
        if dist.is_initialized():
            dist.destroy_process_group()
        raise
    engine.workers = workers
    return engine


def run_worker_node(
    path: str | Path | None,
    cluster: Cluster,
    *,
    dtype: str | None = None,
    kernels: str = "measured",
    quantization: str | None = None,
    timeout_s: float = TIMEOUT_S,
    **options: Any,
) -> int:
    """Run this node's ranks of `cluster` (not node 0) until rank 0 stops them; 0 when every
    one exits cleanly. The options must be node 0's, so every rank builds the same cache."""
    if cluster.node_rank == 0:
        raise ValueError("node 0 runs the engine: call start_tensor_parallel there")
    config, load = _checked(path, cluster, options, dtype, kernels, quantization)
    workers = _start_workers(cluster, cluster.local_ranks, path, load, config, timeout_s)
    for worker in workers:
        worker.join()
    return max(abs(worker.exitcode or 0) for worker in workers)


def _cluster(size: int | Cluster) -> Cluster:
    return (Cluster(size) if isinstance(size, int) else size).with_port()


def _checked(
    path: str | Path | None,
    cluster: Cluster,
    options: dict[str, Any],
    dtype: str | None,
    kernels: str,
    quantization: str | None,
) -> tuple[EngineConfig, dict[str, Any]]:
    """The engine configuration and load options, refused before any process starts."""
    config = EngineConfig(**options)
    check_divisible(LlamaConfig.from_file(model_folder(path) / "config.json"), cluster.size)
    return config, {"dtype": dtype, "kernels": kernels, "quantization": quantization}


def _start_workers(
    cluster: Cluster,
    ranks: range,
    path: str | Path | None,
    load: dict[str, Any],
    config: EngineConfig,
    timeout_s: float,
) -> list[mp.Process]:
    context = mp.get_context("spawn")
    # A spawned process starts on torch's default thread count, not on the one this process
    # chose: handing it over keeps the ranks of one machine from crowding each other's cores.
    threads = torch.get_num_threads()
    workers = [
        context.Process(
            target=_run_worker,
            args=(
                Shard(rank, cluster.size),
                cluster.init_method,
                path,
                load,
                config,
                timeout_s,
                threads,
            ),
            daemon=True,
        )
        for rank in ranks
    ]
    for worker in workers:
        worker.start()
    return workers


def _join_group(shard: Shard, init_method: str, timeout_s: float) -> None:
    """Meet the other ranks at `init_method` (`tcp://host:port`), waiting up to
    `START_TIMEOUT_S` for them to arrive, then form the group whose collectives raise after
    `timeout_s`. The two waits differ on purpose: spawning a rank and importing torch can take
    seconds on a loaded machine (or a node starts later), which is no sign of a hung rank."""
    address = urlsplit(init_method)
    store = dist.TCPStore(
        address.hostname or "127.0.0.1",
        address.port or 0,
        shard.world,
        is_master=shard.rank == 0,
        timeout=timedelta(seconds=max(START_TIMEOUT_S, timeout_s)),
    )
    dist.init_process_group(
        "gloo",
        store=store,
        rank=shard.rank,
        world_size=shard.world,
        timeout=timedelta(seconds=timeout_s),
    )


def _run_worker(
    shard: Shard,
    init_method: str,
    path: str | Path | None,
    load: dict[str, Any],
    config: EngineConfig,
    timeout_s: float,
    threads: int,
) -> None:
    """A worker's life: take the starting process's thread count, join the group, load its
    slice, run every step rank 0 sends."""
    torch.set_num_threads(threads)
    _join_group(shard, init_method, timeout_s)
    model = load_model(path, shard=shard, **load)
    add_all_reduces(model)
    runner = ModelRunner(model, config, leader=False)
    with torch.inference_mode():
        while (plan := _broadcast(None)) is not None:
            runner.execute(plan)
    dist.destroy_process_group()
