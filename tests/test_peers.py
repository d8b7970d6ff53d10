"""`make peers`' pure parts: parsing llama-batched-bench, the workloads, medians and ratios,
the report's tables, lscpu, greedy agreement and the server commands. No build, no download:
a fake cache folder stands in for the prepared peers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmengine.bench.peers import llamacpp, plan, results, vllm_peer
from llmengine.bench.peers.results import Measurement
from llmengine.lessons.peers_figure import plot_peers, read_report, throughput_table

JSONL = "\n".join(
    [
        "main: n_kv_max = 3072, n_batch = 2048, n_ubatch = 512, flash_attn = -1",
        json.dumps({"pp": 32, "tg": 64, "pl": 1, "n_kv": 96, "t": 0.5, "speed": 192.0}),
        "llama_perf_context_print: load time = 12.3 ms",
        json.dumps({"pp": 32, "tg": 64, "pl": 8, "n_kv": 768, "t": 2.0, "speed": 384.0}),
        "{not json",
        json.dumps({"pp": 32, "tg": 64, "pl": 32, "t": 0}),  # no time: not a speed
    ]
)


def test_batched_bench_speeds_are_generated_tokens_over_the_whole_call() -> None:
    speeds = llamacpp.parse_batched_bench(JSONL)
    assert speeds == {1: pytest.approx(64 / 0.5), 8: pytest.approx(8 * 64 / 2.0)}


def test_batched_bench_without_rows_gives_nothing() -> None:
    assert llamacpp.parse_batched_bench("error: unable to load model\n") == {}


def test_workloads_have_the_shapes_of_issue_20() -> None:
    decode = plan.decode_workload(8, 64, vocab_size=2048)
    assert len(decode) == 8
    assert {len(spec.prompt_token_ids) for spec in decode} == {plan.PROMPT_LEN}
    assert {spec.params.max_tokens for spec in decode} == {64}
    mixed = plan.mixed_burst(48, vocab_size=2048)
    assert all(8 <= len(spec.prompt_token_ids) <= 64 for spec in mixed)
    assert all(8 <= spec.params.max_tokens <= 128 for spec in mixed)
    assert all(spec.params.temperature == 0 and spec.params.ignore_eos for spec in mixed)
    longest = max(len(s.prompt_token_ids) + s.params.max_tokens for s in mixed)
    assert longest <= plan.CONTEXT_PER_SEQUENCE
    assert mixed == plan.mixed_burst(48, vocab_size=2048)  # seeded


def test_http_workloads_are_one_burst_at_three_arrival_patterns() -> None:
    named = plan.http_workloads(48, 2048, (32.0, 8.0))
    assert list(named) == ["all at once", "Poisson 32/s", "Poisson 8/s"]
    burst = named["all at once"]
    assert all(spec.arrival == 0 for spec in burst)
    for name in ("Poisson 32/s", "Poisson 8/s"):
        assert [s.prompt_token_ids for s in named[name]] == [s.prompt_token_ids for s in burst]
    # The slower process takes about four times longer to deliver the same requests.
    last_fast, last_slow = named["Poisson 32/s"][-1].arrival, named["Poisson 8/s"][-1].arrival
    assert 0.5 < last_fast < 3 and last_slow == pytest.approx(4 * last_fast)


def rows_of(*measurements: Measurement) -> list[results.Row]:
    return results.aggregate(list(measurements))


def test_rows_keep_the_median_and_every_rounds_load() -> None:
    rows = rows_of(
        Measurement("m", "decode x8", "llmengine", 100.0, 1.0),
        Measurement("m", "decode x8", "llmengine", 300.0, 2.0),
        Measurement("m", "decode x8", "llmengine", 200.0, 3.0, extra={"ttft_p50": 5.0}),
    )
    assert len(rows) == 1
    assert rows[0].tokens_per_s == 200.0
    assert rows[0].loads == (1.0, 2.0, 3.0)
    assert rows[0].extra == {"ttft_p50": 5.0}
    assert rows[0].error is None


def test_a_row_that_never_ran_says_why_and_one_failure_among_rounds_is_outvoted() -> None:
    rows = rows_of(
        Measurement("m", "w", "vLLM", None, 1.0, "SIGILL"),
        Measurement("m", "w", "llmengine", None, 1.0, "timeout"),
        Measurement("m", "w", "llmengine", 50.0, 1.0),
    )
    assert rows[0].tokens_per_s is None and rows[0].error == "SIGILL"
    assert rows[1].tokens_per_s == 50.0 and rows[1].error is None


def test_ratios_are_to_llama_cpp_on_the_same_model_and_workload() -> None:
    rows = rows_of(
        Measurement("a", "w", "llama.cpp", 200.0),
        Measurement("a", "w", "llmengine", 100.0),
        Measurement("b", "w", "llama.cpp", 50.0),
        Measurement("b", "w", "llmengine", 100.0),
        Measurement("a", "v", "llmengine", 100.0),  # no llama.cpp row here
        Measurement("b", "v", "llama.cpp", None, error="build failed"),
        Measurement("b", "v", "vLLM", 10.0),
    )
    ratios = [results.ratio_to_baseline(row, rows) for row in rows]
    assert ratios == [1.0, 0.5, 1.0, 2.0, None, None, None]


def test_the_table_names_model_workload_engine_speed_ratio_and_load() -> None:
    rows = rows_of(
        Measurement("embedded", "decode x1", "llama.cpp", 400.0, 2.5),
        Measurement("embedded", "decode x1", "llmengine", 100.0, 2.25),
        Measurement("embedded", "decode x1", "vLLM", None, 2.0, "no wheel"),
    )
    lines = throughput_table(rows).strip().splitlines()
    assert [c.strip() for c in lines[0].strip("|").split("|")] == [
        "model",
        "workload",
        "engine",
        "tok/s",
        "x llama.cpp",
        "load (1 min, per round)",
    ]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert cells[0] == ["embedded", "decode x1", "llama.cpp", "400.0", "1.00x", "2.5"]
    assert cells[1][3:] == ["100.0", "0.25x", "2.2"]
    assert cells[2][3:] == ["failed: no wheel", "n/a", "2.0"]


def test_lscpu_gives_the_model_name_and_the_isa_flags_that_matter() -> None:
    text = "Architecture: x86_64\nModel name:   AMD EPYC 9B14\nFlags: fpu avx2 avx512f sse\n"
    assert results.parse_lscpu(text) == ("AMD EPYC 9B14", ["avx2", "avx512f"])
    assert results.parse_lscpu("") == ("unknown", [])


def test_agreement_says_where_the_first_difference_is() -> None:
    assert results.agreement([[1, 2], [3]], [[1, 2], [3]]) == "agree (2/2)"
    assert results.agreement([[1, 2], [3, 4]], [[1, 2], [3, 5]]) == "differ: prompt 1 from token 1"
    assert results.agreement([[1, 2]], [[1]]) == "differ: prompt 0 from token 1"
    assert results.agreement([[1]], []) == "differ: 0 outputs for 1 prompts"


def test_server_commands_pin_threads_slots_and_a_local_address(tmp_path: Path) -> None:
    llama = llamacpp.LlamaCpp(tmp_path, tmp_path / "bin", tmp_path / "python", "test")
    with pytest.raises(RuntimeError, match="llama-server is not built"):
        llamacpp.server_command(llama, tmp_path / "m.gguf", 16, 2)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "llama-server").touch()
    command = llamacpp.server_command(llama, tmp_path / "m.gguf", 16, 2)
    assert command[0] == str(tmp_path / "bin" / "llama-server")
    pairs = dict(zip(command[1::2], command[2::2], strict=False))
    assert pairs["--host"] == "127.0.0.1" and pairs["--port"] == "{port}"
    assert pairs["-np"] == "16" and pairs["-c"] == str(16 * plan.CONTEXT_PER_SEQUENCE)
    assert pairs["-t"] == pairs["-tb"] == "2"
    env = vllm_peer.vllm_env(4)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-3" and env["OMP_NUM_THREADS"] == "4"
    assert env["VLLM_TARGET_DEVICE"] == "cpu" and env["VLLM_HOST_IP"] == "127.0.0.1"


def test_the_cache_folder_can_be_moved(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LLMENGINE_PEERS_CACHE", str(tmp_path))
    assert plan.cache_dir() == tmp_path


def test_the_report_is_read_back_into_its_rows_and_its_machine(tmp_path: Path) -> None:
    rows = rows_of(
        Measurement("embedded", "decode x1", "llama.cpp", 400.0, 2.5),
        Measurement("embedded", "decode x1", "llmengine", 100.0, 2.25),
        Measurement("25M", "decode x8", "vLLM", None, 2.0, "no wheel"),
    )
    header = "| | |\n| --- | --- |\n| processor (lscpu) | AMD EPYC 9B14 |\n"
    header += "| ISA flags of avx2, avx512f | avx2, avx512f |\n"
    header += "| load average (1, 5, 15 min) | 1.87, 1.69, 1.59 |\n"
    report = tmp_path / "peers.md"
    report.write_text(f"# Peers\n\n{header}\n## Offline\n\n{throughput_table(rows)}\n")
    machine, read = read_report(report)
    assert machine == (
        "AMD EPYC 9B14 (ISA flags of avx2, avx512f: avx2, avx512f; "
        "load average (1, 5, 15 min): 1.87, 1.69, 1.59)"
    )
    assert [(r.model, r.workload, r.engine, r.tokens_per_s) for r in read] == [
        ("embedded", "decode x1", "llama.cpp", 400.0),
        ("embedded", "decode x1", "llmengine", 100.0),
        ("25M", "decode x8", "vLLM", None),
    ]
    fig = plot_peers(read, machine)
    bars = [patch.get_height() for patch in fig.axes[0].patches]
    assert sorted(bars) == [0.0, 0.0, 0.0, 0.0, 100.0, 400.0]  # 2 groups x 3 engines
    assert fig.axes[0].get_title() == machine


def test_llmengine_serves_the_http_rows_as_serve_defaults_or_on_a_thread() -> None:
    from llmengine.bench.peers.rounds import llmengine_serve_command

    default = llmengine_serve_command("python", Path("ckpt"), decode_graph=True)
    on_a_thread = llmengine_serve_command("python", Path("ckpt"), True, engine_process=False)
    assert "--decode-graph" in default and "--no-engine-process" not in default
    assert on_a_thread == [*default, "--no-engine-process"]
