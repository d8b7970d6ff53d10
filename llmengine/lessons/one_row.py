"""One decode stream against its ceiling and against llama.cpp, measured in one run.

A decode step of one row reads every weight once, so it can go no faster than the bandwidth of
wherever the weights come from over their bytes. For a model larger than the last-level cache
that is DRAM. The embedded model's 13.7 MB of float32 weights can stay in a 16 MB cache from
one step to the next, and then the ceiling is the cache's bandwidth, several times DRAM's.
`measure` times both read bandwidths, llama.cpp's decode at one sequence, llmengine's eager
one-row step (and its matrix products alone) and one stream through llmengine's engine with
its decode graph (`engine_stream`) on the same threads, in interleaved rounds;
`report` renders it for `scripts/one_row_ceiling.py` and `read_report` gives it back to
lesson 25.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from llmengine.engine import Engine
from llmengine.lessons.artifacts import markdown_table
from llmengine.lessons.roofline import read_bandwidth
from llmengine.lessons.step_cost import decode_cost, decode_step_operators
from llmengine.model.llama import Llama
from llmengine.params import SamplingParams

# A working set 32 times a 16 MB last-level cache: every pass of the sum streams from DRAM.
DRAM_WORKING_SET = 512 * 2**20
# The decode shape of the peers' `decode x1` row: 32 prompt tokens, then 64 generated, so a
# step reads about 64 cached positions on average.
PROMPT_TOKENS, GENERATED_TOKENS, CONTEXT = 32, 64, 64

# Each measured field's label in the report, which `read_report` reads back by it.
LABELS = {
    "threads": "threads, both engines and the sums",
    "weight_bytes": "float32 weight bytes a one-row step reads",
    "cache_bandwidth": "read bandwidth, working set of the weights (GB/s)",
    "dram_bandwidth": "read bandwidth, 512 MB working set (GB/s)",
    "llamacpp_tokens_per_s": "llama.cpp decode at one sequence (tok/s, generation only)",
    "llmengine_step_s": "llmengine one-row decode step (ms)",
    "llmengine_products_s": "llmengine's matrix products alone in that step (ms)",
    "operators_per_step": "operators llmengine dispatches per one-row step",
    "engine_stream_tokens_per_s": (
        "llmengine one stream through its engine, decode graph (tok/s, generation only)"
    ),
}
# Fields the report shows in other units than the dataclass keeps (GB/s, ms).
SCALES = {
    "cache_bandwidth": 1e9,
    "dram_bandwidth": 1e9,
    "llmengine_step_s": 1e-3,
    "llmengine_products_s": 1e-3,
}


@dataclass(frozen=True, slots=True)
class OneRowRun:
    """What one run measured; the bounds and shares are computed from it."""

    threads: int
    weight_bytes: int
    cache_bandwidth: float  # bytes/s
    dram_bandwidth: float  # bytes/s
    llamacpp_tokens_per_s: float  # nan when llama.cpp could not run
    llmengine_step_s: float
    llmengine_products_s: float
    operators_per_step: int
    engine_stream_tokens_per_s: float  # nan when it was not measured

    def bound(self, bandwidth: float) -> float:
        """Tokens per second one stream decodes at most if a step only read its weights."""
        return bandwidth / self.weight_bytes

    @property
    def llamacpp_step_s(self) -> float:
        """llama.cpp's seconds per generated token at one sequence."""
        return 1 / self.llamacpp_tokens_per_s

    @property
    def llmengine_outside_products_s(self) -> float:
        """What llmengine's step spends outside its matrix products: the other operators and
        the host work of dispatching every operator."""
        return self.llmengine_step_s - self.llmengine_products_s


def last_level_cache() -> str:
    """The last-level cache as `lscpu` names it ("16 MiB (1 instance)"), or "unknown"."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    caches = [
        line.split(":", 1)[1].strip()
        for line in text.splitlines()
        if line.startswith("L") and " cache:" in line
    ]
    return caches[-1] if caches else "unknown"


def engine_stream(model: Llama, decode_graph: Sequence[int] = (1,)) -> Callable[[], float]:
    """A call timing one greedy stream through an engine of one slot, as llama.cpp's row is
    timed: a prompt of `PROMPT_TOKENS`, then the seconds of `GENERATED_TOKENS` decode steps
    alone, as tokens per second. The engine is built here, at the current thread count, with
    the decode graph for the `decode_graph` buckets (empty: eager); its compile is not timed."""
    engine = Engine(model, num_blocks=16, num_slots=1, decode_graph=list(decode_graph) or False)
    prompt = list(range(1, PROMPT_TOKENS + 1))
    params = SamplingParams(max_tokens=GENERATED_TOKENS + 1, ignore_eos=True)

    def tokens_per_s() -> float:
        engine.add_request(prompt, params)
        engine.step()  # the prefill, and the first token
        started, steps = time.perf_counter(), 0
        while engine.has_unfinished():
            engine.step()
            steps += 1
        return steps / (time.perf_counter() - started)

    return tokens_per_s


def measure(
    model: Llama,
    weight_bytes: int,
    llamacpp_decode: Callable[[], float] | None,
    threads: int,
    rounds: int = 3,
    dram_working_set: int = DRAM_WORKING_SET,
    stream: Callable[[], float] | None = None,
) -> OneRowRun:
    """Each quantity `rounds` times in turn, keeping each one's best (a shared machine only
    ever slows a measurement down). `llamacpp_decode` returns llama.cpp's generated tok/s at
    one sequence, `stream` llmengine's (`engine_stream`); None leaves either out (nan)."""
    torch.set_num_threads(threads)
    best = {"cache": 0.0, "dram": 0.0, "llamacpp": 0.0, "step": float("inf"), "stream": 0.0}
    products = float("inf")
    for _ in range(rounds):
        # A sum of the weights takes a tenth of a millisecond; on a shared machine one of its
        # threads is often descheduled, so it gets many tries to find both running.
        best["cache"] = max(best["cache"], read_bandwidth(weight_bytes, repeats=200))
        best["dram"] = max(best["dram"], read_bandwidth(dram_working_set, repeats=5))
        if llamacpp_decode is not None:
            best["llamacpp"] = max(best["llamacpp"], llamacpp_decode())
        if stream is not None:
            best["stream"] = max(best["stream"], stream())
        cost = decode_cost(model, rows=1, context=CONTEXT, repeats=20)
        best["step"] = min(best["step"], cost.step_s)
        products = min(products, cost.products_s)
    operators = sum(decode_step_operators(model, rows=1, context=CONTEXT).values())
    return OneRowRun(
        threads=threads,
        weight_bytes=weight_bytes,
        cache_bandwidth=best["cache"],
        dram_bandwidth=best["dram"],
        llamacpp_tokens_per_s=best["llamacpp"] or float("nan"),
        llmengine_step_s=best["step"],
        llmengine_products_s=products,
        operators_per_step=operators,
        engine_stream_tokens_per_s=best["stream"] or float("nan"),
    )


def report(run: OneRowRun, header: str) -> str:
    """The report: `header` (the machine and the command), then one row per measurement."""
    rows = []
    for field in fields(OneRowRun):
        value = getattr(run, field.name)
        value = value / SCALES[field.name] if field.name in SCALES else value
        text = f"{value:,.3f}" if isinstance(value, float) else f"{value:,}"
        rows.append([LABELS[field.name], text])
    table = markdown_table(rows, ["measurement", "value"])
    return (
        "# One decode stream against its ceiling and llama.cpp\n\n"
        f"{header}\n\n"
        "Every row below comes from the same run, on the same threads, each the best of its "
        "interleaved rounds. The read bandwidths are sums over float32 tensors "
        "(`roofline.read_bandwidth`); llama.cpp is `llama-batched-bench` at one sequence, "
        f"{PROMPT_TOKENS} prompt tokens then {GENERATED_TOKENS} generated (generation time "
        f"alone); llmengine's step is one eager decode step of the embedded model at {CONTEXT} "
        "cached positions, with the kernels `load_model` measures, and its stream the same "
        "prompt and generation as llama.cpp's through an engine with the decode graph "
        "(generation time alone).\n\n"
        f"{table}"
    )


def read_report(path: str | Path) -> tuple[str, OneRowRun]:
    """The report's machine line (its first line after the title) and its measurements."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    machine = next(line for line in lines[1:] if line.strip())
    by_label = {}
    for line in lines:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 2:
            by_label[cells[0]] = cells[1]
    values = {}
    for field in fields(OneRowRun):
        text = by_label[LABELS[field.name]].replace(",", "")
        number = float(text) * SCALES.get(field.name, 1)
        values[field.name] = int(number) if field.type == "int" else number
    return machine, OneRowRun(**values)
