"""The measuring loops of `make peers`: offline decode and the mixed burst per model, then
the HTTP workload against each server alone.

Rounds are interleaved (llama.cpp, vLLM, llmengine, llama.cpp, ...) so that a busy neighbour
slows every engine alike, and every measurement records the load when it started. tok/s is
always generated tokens over the wall time of the whole call (prompts included). A peer that
fails gives rows with its reason; the others go on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llmengine.bench import throughput
from llmengine.bench.http_client import run_over_http, served_model
from llmengine.bench.peers import llamacpp, servers
from llmengine.bench.peers.llamacpp import LlamaCpp
from llmengine.bench.peers.plan import (
    GREEDY_PROMPTS,
    GREEDY_TOKENS,
    HTTP_BLOCKS,
    HTTP_SLOTS,
    PROMPT_LEN,
    decode_workload,
    mixed_burst,
    thread_env,
)
from llmengine.bench.peers.results import Measurement, current_load, failed
from llmengine.bench.peers.vllm_peer import OfflineWorker, Vllm, server_command, vllm_env
from llmengine.bench.serving_report import run_summary
from llmengine.bench.workloads import RequestSpec, with_budgets
from llmengine.engine import Engine
from llmengine.model.llama import Llama

LLAMA, VLLM, LLMENGINE = "llama.cpp", "vLLM", "llmengine"
CALL_TIMEOUT_S = 900.0  # the most one offline call or one HTTP request may take
MIXED = "mixed burst"


@dataclass(slots=True)
class Settings:
    """What a run measures: `batches` sequences x `tokens` each, a mixed burst of
    `mixed_requests`, `rounds` interleaved rounds on `threads` threads."""

    threads: int
    rounds: int
    batches: tuple[int, ...]
    tokens: int
    mixed_requests: int
    cache: Path
    decode_graph: bool = False  # llmengine with `Engine(decode_graph=True)` / `--decode-graph`
    engine_process: bool = True  # llmengine's server as it defaults; False: `--no-engine-process`


@dataclass(slots=True)
class Peers:
    """The prepared peers, or why each is missing."""

    llama: LlamaCpp | None = None
    vllm: Vllm | None = None
    errors: dict[str, str] = field(default_factory=dict)


def _reason(error: Exception) -> str:
    return " ".join(f"{type(error).__name__}: {error}".split())[:300]


def _greedy_workload(mixed: Sequence[RequestSpec]) -> list[RequestSpec]:
    head = list(mixed[:GREEDY_PROMPTS])
    return with_budgets(head, [GREEDY_TOKENS] * len(head))


def offline(
    label: str,
    checkpoint: Path,
    gguf: Path | None,
    peers: Peers,
    settings: Settings,
    greedy: dict[str, list[list[int]] | str],
) -> list[Measurement]:
    """Decode at every batch size and the mixed burst, through the three engines, in rounds;
    fills `greedy` with each engine's token ids for the first prompts of the burst."""
    from llmengine.runner.loading import load_model

    model = load_model(checkpoint)
    vocab = model.config.vocab_size
    named = {f"decode x{b}": decode_workload(b, settings.tokens, vocab) for b in settings.batches}
    mixed = mixed_burst(settings.mixed_requests, vocab)
    named[MIXED] = mixed
    probe = _greedy_workload(mixed)
    out: list[Measurement] = []
    slots = max(len(workload) for workload in named.values())
    run_llmengine = _llmengine_runner(model, named, slots, settings.decode_graph)
    greedy[LLMENGINE] = run_llmengine(probe).outputs
    for round_ in range(settings.rounds):
        print(f"  {label}: round {round_ + 1}/{settings.rounds}", flush=True)
        # vLLM's worker lives only for its own turn: with it loaded beside them, llmengine's
        # rows of a full run came out 2-4x slower than llmengine alone, so each engine runs
        # with no other engine's process on the machine.
        worker = _vllm_worker(label, checkpoint, slots, probe, peers, settings)
        try:
            if worker is not None and VLLM not in greedy:
                greedy[VLLM] = _vllm_outputs(worker, probe)
            for name, workload in named.items():
                out.append(_vllm_offline(label, name, workload, worker, peers))
        finally:
            if worker is not None:
                worker.close()
        out += _llama_decode(label, gguf, peers, settings)
        for name, workload in named.items():
            load = current_load()
            run = run_llmengine(workload)
            out.append(Measurement(label, name, LLMENGINE, run.tokens_per_s, load))
    out += _llama_mixed(label, gguf, peers, settings, mixed, probe, greedy)
    return out


def _llmengine_runner(
    model: Llama, named: dict[str, list[RequestSpec]], slots: int, decode_graph: bool
) -> Callable[[Sequence[RequestSpec]], throughput.EngineRun]:
    """How llmengine runs a workload: a fresh engine each time, or, with `decode_graph`, one
    engine for them all, built (its graphs compiled, minutes) before anything is timed."""
    if not decode_graph:
        return lambda workload: throughput.run_llmengine(model, workload)
    block_size = 16  # as run_llmengine's engines
    blocks = max(throughput.pool_blocks(workload, block_size) for workload in named.values())
    print(f"  compiling the decode graph for {slots} slots", flush=True)
    engine = Engine(
        model, num_blocks=blocks, block_size=block_size, num_slots=slots, decode_graph=True
    )
    return lambda workload: throughput.run_on_engine(engine, workload)


def _vllm_worker(
    label: str,
    checkpoint: Path,
    slots: int,
    warmup: Sequence[RequestSpec],
    peers: Peers,
    settings: Settings,
) -> OfflineWorker | None:
    """A started vLLM worker for `checkpoint` that has served `warmup` (one token each,
    untimed), or None, the reason kept in `peers.errors`."""
    if peers.vllm is None or f"{VLLM} {label}" in peers.errors:
        return None
    log = settings.cache / "logs" / f"vllm-offline-{label}.log"
    worker = None
    try:
        worker = OfflineWorker(peers.vllm, checkpoint, slots, settings.threads, log)
        prompts = [spec.prompt_token_ids for spec in warmup]
        worker.generate(prompts, [1] * len(prompts), CALL_TIMEOUT_S)
    except RuntimeError as error:
        peers.errors[f"{VLLM} {label}"] = _reason(error)
        if worker is not None:
            worker.close()
        return None
    return worker


def _vllm_outputs(worker: OfflineWorker, workload: Sequence[RequestSpec]) -> list[list[int]]:
    prompts = [spec.prompt_token_ids for spec in workload]
    budgets = throughput.budgets_of(workload)
    return worker.generate(prompts, budgets, CALL_TIMEOUT_S)[1]


def _vllm_offline(
    label: str,
    name: str,
    workload: Sequence[RequestSpec],
    worker: OfflineWorker | None,
    peers: Peers,
) -> Measurement:
    if worker is None:
        reason = peers.errors.get(f"{VLLM} {label}") or peers.errors.get(VLLM, "skipped")
        return failed(label, name, VLLM, reason)
    load = current_load()
    try:
        prompts = [spec.prompt_token_ids for spec in workload]
        seconds, outputs = worker.generate(prompts, throughput.budgets_of(workload), CALL_TIMEOUT_S)
    except RuntimeError as error:
        return failed(label, name, VLLM, _reason(error))
    tokens = throughput.useful_tokens(outputs, workload)
    return Measurement(label, name, VLLM, tokens / seconds, load)


def _llama_decode(
    label: str, gguf: Path | None, peers: Peers, settings: Settings
) -> list[Measurement]:
    names = [f"decode x{b}" for b in settings.batches]
    if peers.llama is None or gguf is None:
        reason = peers.errors.get(LLAMA, "skipped")
        return [failed(label, name, LLAMA, reason) for name in names]
    load = current_load()
    try:
        speeds = llamacpp.batched_bench(
            peers.llama,
            gguf,
            settings.batches,
            PROMPT_LEN,
            settings.tokens,
            settings.threads,
            CALL_TIMEOUT_S,
        )
    except (RuntimeError, OSError, ValueError) as error:
        return [failed(label, name, LLAMA, _reason(error)) for name in names]
    return [
        Measurement(label, f"decode x{b}", LLAMA, speeds[b], load)
        if b in speeds
        else failed(label, f"decode x{b}", LLAMA, "no row in llama-batched-bench's output")
        for b in settings.batches
    ]


def _llama_mixed(
    label: str,
    gguf: Path | None,
    peers: Peers,
    settings: Settings,
    mixed: Sequence[RequestSpec],
    probe: Sequence[RequestSpec],
    greedy: dict[str, list[list[int]] | str],
) -> list[Measurement]:
    """llama.cpp has no offline mixed-budget runner, so its mixed burst goes through
    llama-server with a slot per request (streamed over HTTP on 127.0.0.1)."""
    if peers.llama is None or gguf is None:
        greedy[LLAMA] = peers.errors.get(LLAMA, "skipped")
        return [failed(label, MIXED, LLAMA, greedy[LLAMA])] * settings.rounds
    log = settings.cache / "logs" / f"llama-server-{label}.log"
    out = []
    try:
        command = llamacpp.server_command(peers.llama, gguf, len(mixed), settings.threads)
        with servers.running(
            command, env=thread_env(settings.threads), log=log, start_timeout=300
        ) as url:
            prompts = [spec.prompt_token_ids for spec in probe]
            greedy[LLAMA] = llamacpp.greedy_tokens(url, prompts, GREEDY_TOKENS, CALL_TIMEOUT_S)
            name = served_model(f"{url}/v1")
            for _ in range(settings.rounds):
                out.append(_over_http(label, MIXED, LLAMA, url, name, mixed))
    except Exception as error:  # noqa: BLE001 - any failure of the peer is reported, not raised
        greedy.setdefault(LLAMA, _reason(error))
        out.append(failed(label, MIXED, LLAMA, _reason(error)))
    return out


def _over_http(
    label: str,
    workload_name: str,
    engine: str,
    url: str,
    model: str,
    workload: Sequence[RequestSpec],
    rate: float = math.inf,
) -> Measurement:
    """One `llmengine bench --url` run (the same client, in-process) as a measurement."""
    load = current_load()
    run = run_over_http(f"{url}/v1", model, workload, timeout=CALL_TIMEOUT_S)
    summary = run_summary(run, request_rate=rate)
    extra = {
        "ttft_p50": summary["ttft_ms"]["p50"],
        "tpot_p50": summary["tpot_ms"]["p50"],
    }
    extra = {key: value for key, value in extra.items() if value is not None}
    if summary["failed"]:
        error = f"{summary['failed']}/{summary['requests']} failed: {summary['errors'][0]}"
        return Measurement(label, workload_name, engine, None, load, error)
    return Measurement(
        label, workload_name, engine, summary["output_token_throughput"], load, None, extra
    )


def http_servers(
    peers: Peers,
    checkpoint: Path,
    gguf: Path | None,
    threads: int,
    python: str,
    decode_graph: bool = False,
    engine_process: bool = True,
) -> dict[str, tuple[list[str] | None, dict[str, str], str]]:
    """Each engine's server: command (None when the peer is missing), environment, and why."""
    table: dict[str, tuple[list[str] | None, dict[str, str], str]] = {}
    if peers.llama is not None and gguf is not None:
        try:
            command = llamacpp.server_command(peers.llama, gguf, HTTP_SLOTS, threads)
            table[LLAMA] = (command, thread_env(threads), "")
        except RuntimeError as error:
            table[LLAMA] = (None, {}, _reason(error))
    else:
        table[LLAMA] = (None, {}, peers.errors.get(LLAMA, "skipped"))
    if peers.vllm is not None:
        command = server_command(peers.vllm, checkpoint, checkpoint.name, HTTP_SLOTS)
        table[VLLM] = (command, vllm_env(threads), "")
    else:
        table[VLLM] = (None, {}, peers.errors.get(VLLM, "skipped"))
    table[LLMENGINE] = (
        llmengine_serve_command(python, checkpoint, decode_graph, engine_process),
        thread_env(threads),
        "",
    )
    return table


def llmengine_serve_command(
    python: str, checkpoint: Path, decode_graph: bool, engine_process: bool = True
) -> list[str]:
    """`llmengine serve` as the HTTP rows run it: `HTTP_SLOTS` sequences on a pool of
    `HTTP_BLOCKS` blocks, with the decode graph or not, its engine in a process of its own
    (the default) or on a thread of the server's; `{port}` is filled in by `servers.running`.
    The forward's threads are `serve`'s default: the environment's threads but one."""
    command = [python, "-m", "llmengine", "serve", "--host", "127.0.0.1", "--port", "{port}"]
    command += ["--model", str(checkpoint), "--max-num-seqs", str(HTTP_SLOTS)]
    command += ["--num-blocks", str(HTTP_BLOCKS)]
    command += ["--decode-graph"] * decode_graph
    return command + ["--no-engine-process"] * (not engine_process)


def http_rounds(
    label: str,
    table: dict[str, tuple[list[str] | None, dict[str, str], str]],
    workloads: dict[str, list[RequestSpec]],
    rates: dict[str, float],
    settings: Settings,
) -> list[Measurement]:
    """Each round starts each server alone, runs every workload through it, and stops it."""
    out = []
    for round_ in range(settings.rounds):
        for engine, (command, env, reason) in table.items():
            print(f"  HTTP round {round_ + 1}/{settings.rounds}: {engine}", flush=True)
            names = [f"HTTP {name}" for name in workloads]
            if command is None:
                out += [failed(label, name, engine, reason) for name in names]
                continue
            log = settings.cache / "logs" / f"serve-{engine}-{label}.log"
            rows: list[Measurement] = []
            try:
                # A first start with --decode-graph compiles every bucket: minutes.
                start_timeout = 1800 if settings.decode_graph else 600
                with servers.running(command, env=env, log=log, start_timeout=start_timeout) as url:
                    model = served_model(f"{url}/v1")
                    warmup = next(iter(workloads.values()))[:4]
                    run_over_http(f"{url}/v1", model, warmup, timeout=CALL_TIMEOUT_S)
                    for name, workload in workloads.items():
                        rate = rates.get(name, math.inf)
                        rows.append(
                            _over_http(label, f"HTTP {name}", engine, url, model, workload, rate)
                        )
            except Exception as error:  # noqa: BLE001 - a failing server is a row, not a crash
                done = {row.workload for row in rows}
                rows += [failed(label, n, engine, _reason(error)) for n in names if n not in done]
            out += rows
    return out
