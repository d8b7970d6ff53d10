"""`scripts/bench_cuda.py` on the CPU: a tiny random Llama, two batch sizes, a few tokens.

The benchmark's numbers belong to a GPU; what a CPU can check is that its rows cannot
contradict each other (every token counted, the prefill and the decode steps split where they
are, the table showing the runs' own rates) and that it writes its report where it is told,
never over the committed one. transformers runs on its static cache uncompiled here, since
compiling it would take the test from seconds to a minute.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
from hf_llama import save_random_llama

from llmengine.bench import gpu_burst
from llmengine.bench.gpu_targets import EAGER, TRANSFORMERS
from llmengine.lessons.artifacts import ARTIFACTS_ENV

ROOT = Path(__file__).resolve().parent.parent
BATCHES, PROMPT_LEN, MAX_TOKENS = (1, 3), 6, 5


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory: pytest.TempPathFactory):
    """The script's `main` once, its report sent to a temporary folder; (bench, report path)."""
    checkpoint = tmp_path_factory.mktemp("bench-cuda-llama")
    save_random_llama(checkpoint, seed=3)
    artifacts = tmp_path_factory.mktemp("artifacts")
    spec = importlib.util.spec_from_file_location("bench_cuda", ROOT / "scripts" / "bench_cuda.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ARTIFACTS_ENV, str(artifacts))
        bench = script.main(
            ["--device", "cpu", "--model", str(checkpoint), "--dtype", "float32",
             "--batch-sizes", ",".join(map(str, BATCHES)), "--prompt-len", str(PROMPT_LEN),
             "--max-tokens", str(MAX_TOKENS), "--no-graph", "--no-compile-transformers",
             "--bandwidth-gbs", "50"]
        )  # fmt: skip
    return bench, artifacts / "reports" / "wallclock" / "cuda-throughput.md"


def runs_of(bench, engine: str) -> list[gpu_burst.BurstRun]:
    runs = [run for run in bench.runs if run.engine == engine]
    assert [run.batch for run in runs] == list(BATCHES)
    return runs


def test_engine_rows_split_one_run_at_its_prefill(bench_run) -> None:
    bench, _ = bench_run
    weights = gpu_burst.weight_bytes(bench.model)
    for run in runs_of(bench, EAGER):
        assert run.tokens == run.batch * MAX_TOKENS
        assert [len(tokens) for tokens in run.outputs] == [MAX_TOKENS] * run.batch
        assert run.decode_steps == MAX_TOKENS - 1  # every step after the prefill decodes
        assert 0 < run.ttft_s < run.whole_s
        assert math.isclose(run.ttft_s + run.decode_s, run.whole_s)
        assert math.isclose(run.whole_tokens_per_s * run.whole_s, run.tokens)
        decode_tokens = run.batch * (MAX_TOKENS - 1)
        assert math.isclose(run.decode_tokens_per_s * run.step_s * run.decode_steps, decode_tokens)
        assert run.decode_bytes > weights * run.decode_steps  # the weights, and some K/V


def test_transformers_rows_are_whole_runs_of_the_same_tokens(bench_run) -> None:
    bench, _ = bench_run
    for ours, theirs in zip(runs_of(bench, EAGER), runs_of(bench, TRANSFORMERS), strict=True):
        assert theirs.first_token is None and theirs.ttft_s is None
        assert theirs.tokens == theirs.batch * MAX_TOKENS
        assert theirs.whole_tokens_per_s > 0
        assert theirs.outputs == ours.outputs  # float32, greedy: the same weights agree


def test_the_report_shows_the_runs_own_rates_in_the_folder_it_was_given(bench_run) -> None:
    bench, report = bench_run
    text = report.read_text()
    committed = ROOT / "reports" / "wallclock" / "cuda-throughput.md"
    assert committed.resolve() != report.resolve()
    lines = text.splitlines()
    for run in bench.runs:
        (row,) = [line for line in lines if line.startswith(f"| {run.batch:5d} | {run.engine} ")]
        assert f" {run.whole_tokens_per_s:,.0f} |" in row
        if run.decode_tokens_per_s is not None:
            assert f" {run.ttft_s * 1e3:.1f} |" in row
            assert f" {run.decode_tokens_per_s:,.0f} |" in row
    assert "not run (--no-graph)" in text
    assert "| 64    | decode tokens/s" in text and "not measured" in text
