"""The engine on a GPU: decode tokens/s by batch size, against the memory-bandwidth bound.

For each dtype (bfloat16, float32) and batch size (1 .. 256), a uniform burst of that many
requests runs through one engine with a slot for each; every step after the prefill is a
decode of the whole batch, timed alone. A decode step must read every weight once and every
row's K/V so far, so `bytes / step time` is the bandwidth it reached; the GPU's own bound
comes from `torch.cuda.get_device_properties` (memory clock x bus width) where torch reports
them, else from `--bandwidth-gbs`. Then the same bursts through transformers `generate` and
`generate_batch` on the same weights (`llmengine.bench.throughput`), useful tokens per second.

The model is `--model DIR`, or a random Llama of about 1.2B parameters (the Llama 3.2 1B
shape) written by transformers. Writes `reports/wallclock/cuda-throughput.md`.

Usage: .venv/bin/python scripts/bench_cuda.py [--model DIR] [--batch-sizes 1,8,64]
A wall-clock benchmark, not a test: its numbers belong to the GPU and the moment that ran it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from bench_decode_step import machine  # scripts/ is on the path when this script runs

import llmengine
from llmengine.bench import throughput
from llmengine.lessons.artifacts import markdown_table, write_report
from llmengine.model.config import DTYPES

REPORT = "cuda-throughput"
BLOCK_SIZE = 16
H200_BANDWIDTH_GBS = 4800.0
ONE_B_SHAPE = {
    "vocab_size": 128256,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}


def device_bandwidth_gbs() -> float | None:
    """Peak memory bandwidth from the device's memory clock (kHz) and bus width (bits).

    Double data rate: two transfers per clock. None when this torch does not report them.
    """
    props = torch.cuda.get_device_properties(0)
    clock_khz = getattr(props, "memory_clock_rate", None)
    bus_bits = getattr(props, "memory_bus_width", None)
    if not clock_khz or not bus_bits:
        return None
    return 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9


def decode_steps(model: llmengine.Llama, batch: int, prompt_len: int, max_tokens: int) -> dict:
    """One burst of `batch` requests; median decode step seconds and the bytes it must read."""
    workload = llmengine.uniform_burst(
        batch, prompt_len, max_tokens, vocab_size=model.config.vocab_size
    )
    engine = llmengine.Engine(
        model,
        num_blocks=throughput.pool_blocks(workload, BLOCK_SIZE),
        block_size=BLOCK_SIZE,
        num_slots=batch,
    )
    engine.add_requests(throughput.prompts_of(workload), [spec.params for spec in workload])
    seconds, kv_tokens = [], []
    while engine.has_unfinished():
        torch.cuda.synchronize()
        start = time.perf_counter()
        outcome = engine.step()  # ends by reading the sampled ids back: the step is done
        elapsed = time.perf_counter() - start
        if outcome.prefill_rows == 0 and outcome.rows == batch:
            seconds.append(elapsed)
            kv_tokens.append(outcome.kv_tokens)
    weights = sum(w.numel() * w.element_size() for w in throughput.decode_weights(model))
    kv_per_token = engine.runner.cache.bytes_per_block / BLOCK_SIZE
    step_s = statistics.median(seconds)
    return {
        "step_s": step_s,
        "tokens_per_s": batch / step_s,
        "bytes": weights + kv_per_token * statistics.mean(kv_tokens),
    }


def transformers_rows(
    folder: Path, model: llmengine.Llama, dtype_name: str, batches: list[int], args
) -> list[list]:
    """Useful tokens/s of llmengine and transformers' engines on the same bursts.

    An engine that fails on a batch is a row saying why, not the end of the benchmark:
    transformers' batching API moves between releases, and the decode table must still be
    written.
    """
    import transformers

    hf = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=DTYPES[dtype_name])
    runners = throughput.standard_runners(model, hf.to("cuda").eval(), BLOCK_SIZE)
    skipped = set(args.skip.split(","))
    baselines = [name for name in throughput.ENGINES[1:] if name not in skipped]
    runners = {name: runners[name] for name in ("llmengine", *baselines)}
    rows = []
    for batch in batches:
        workload = llmengine.uniform_burst(
            batch, args.prompt_len, args.max_tokens, vocab_size=model.config.vocab_size
        )
        # `compare` keeps going past an engine that raises and says why in its place.
        comparison = throughput.compare(runners, workload, repeats=args.repeats, warmup=1)
        runs, failures = comparison.runs, comparison.failures
        for name in baselines:
            if "llmengine" not in runs or name not in runs:
                reason = failures.get("llmengine") or failures[name]
                rows.append([dtype_name, batch, name, 0.0, 0.0, 0.0, reason[:80]])
                continue
            ours = runs["llmengine"]
            same = throughput.agreement(ours.outputs, runs[name].outputs)
            rows.append(
                [dtype_name, batch, name, runs[name].tokens_per_s,
                 ours.tokens_per_s, throughput.speedup(ours, runs[name]),
                 f"{same.identical}/{same.requests}"]
            )  # fmt: skip
    del hf
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, metavar="DIR")
    parser.add_argument("--dtypes", default="bfloat16,float32", metavar="D,D")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32,64,128,256")
    parser.add_argument("--compare-batch-sizes", default="1,16,64,256", metavar="B,B")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip", default="", metavar="generate_batch",
                        help="transformers engines to leave out, comma-separated")  # fmt: skip
    parser.add_argument("--bandwidth-gbs", type=float, default=None, metavar="GB/S",
                        help="the bound (default: from the device, else the H200's)")  # fmt: skip
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_cuda.py: torch sees no CUDA device; this benchmark needs one")
    measured = device_bandwidth_gbs()
    bound = args.bandwidth_gbs or measured or H200_BANDWIDTH_GBS
    source = "--bandwidth-gbs" if args.bandwidth_gbs else "device" if measured else "H200 default"
    dtypes = args.dtypes.split(",")
    if unknown := sorted(set(dtypes) - set(DTYPES)):
        sys.exit(f"bench_cuda.py: unknown dtypes {unknown} (use {sorted(DTYPES)})")
    batches = [int(b) for b in args.batch_sizes.split(",")]
    compare = [int(b) for b in args.compare_batch_sizes.split(",")]
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.model
        if folder is None:
            folder = Path(scratch)
            throughput.save_random_checkpoint(folder, **ONE_B_SHAPE)
        decode, versus = [], []
        for name in dtypes:
            model = llmengine.load_model(folder, device="cuda", dtype=name)
            parameters = throughput.parameter_count(model)
            decode_steps(model, 1, args.prompt_len, 4)  # kernels loaded, caches warm
            for batch in batches:
                step = decode_steps(model, batch, args.prompt_len, args.max_tokens)
                reached = step["bytes"] / step["step_s"] / 1e9
                decode.append([name, batch, step["step_s"] * 1e3, step["tokens_per_s"],
                               step["bytes"] / 1e6, reached, reached / bound])  # fmt: skip
                print(f"{name} batch {batch}: {step['tokens_per_s']:.0f} tokens/s", flush=True)
            versus += transformers_rows(folder, model, name, compare, args)
            del model
            torch.cuda.empty_cache()
    gpu = torch.cuda.get_device_name(0)
    text = "\n".join([
        f"# The engine on {gpu}\n",
        f"Model: {args.model or 'random Llama, Llama 3.2 1B shape'} ({parameters / 1e9:.2f}B "
        f"parameters); uniform bursts, {args.prompt_len}-token prompts, {args.max_tokens} "
        f"tokens each, greedy. Bandwidth bound {bound:.0f} GB/s ({source}).\n",
        "## Decode steps\n",
        "Median decode step. MB read: every weight once plus the K/V every row attends "
        "over, the least a step can move; the engine moves more (it gathers each row's K/V "
        "into a padded copy per layer), so the share of the bound is an upper limit's.\n",
        markdown_table(decode, ["dtype", "batch", "step ms", "tokens/s", "MB read", "GB/s",
                                "of bound"], ["", "d", ".2f", ".0f", ".1f", ".0f", ".1%"]),
        "## Against transformers\n",
        "Useful tokens/s per whole run (prefill included), median of "
        f"{args.repeats}; identical = requests whose tokens equal llmengine's.\n",
        markdown_table(versus, ["dtype", "batch", "baseline", "baseline tokens/s",
                                "llmengine tokens/s", "speed-up", "identical"],
                       ["", "d", "", ".0f", ".0f", ".2f", ""]),
        "## Machine\n",
        markdown_table([*machine(), ("GPU", gpu)], ["", ""]),
    ])  # fmt: skip
    print(f"wrote {write_report(REPORT, text, wallclock=True)}")


if __name__ == "__main__":
    main()
