"""`scripts/bench_http_bound.py`'s report: medians of the rounds, and the two ratios it states
computed from them (the measurement itself serves HTTP for minutes: run by hand)."""

from __future__ import annotations

import re
import time

from test_pipeline import load_script

bound = load_script("bench_http_bound")


def served(rate: float, load: float = 1.0) -> dict[str, float]:
    return {"tok/s": rate, "ttft p50": 700.0, "ttft p99": 1800.0, "tpot p50": 9.5, "load": load}


def test_the_report_states_the_medians_and_their_ratios() -> None:
    rows = {
        "in-process": [{"tok/s": r, "load": 1.0} for r in (2000.0, 2400.0, 2200.0)],
        "served, 1 thread(s)": [served(r) for r in (1400.0, 1500.0, 1000.0)],
        "served, 2 thread(s)": [served(r, 2.0) for r in (1500.0, 1100.0, 1650.0)],
    }
    text = bound.report(rows, 3, ["--rounds", "3"], time.perf_counter())
    assert "| in-process " in text and "2,200" in text  # the median, not the mean or the last
    assert "2.0 / 2.0 / 2.0" in text
    # 1,500 against 1,400 at 1 thread; in-process 2,200 against 1,500 served at 2 threads
    assert "at 1.07x its rate at 1 thread" in text
    assert "in-process at 1.47x the rate served at 2 threads" in text
    assert "`scripts/bench_http_bound.py --rounds 3`" in text
    assert "llama-server" not in text.split("|")[-1]  # no peer, no sentence about one


def test_the_report_sets_both_served_rates_against_llama_server() -> None:
    rows = {
        "in-process": [{"tok/s": 2000.0, "load": 1.0}],
        "served, 1 thread(s)": [served(1500.0)],
        "served, 2 thread(s)": [served(1200.0)],
        "llama-server, 2 thread(s)": [served(1600.0)],
    }
    text = bound.report(rows, 1, [], time.perf_counter())
    assert "| llama-server, 2 thread(s) | 1,600 " in text
    assert "Against llama-server, 2 thread(s): llmengine served at 1 thread 0.94x" in text
    assert "at 2 threads 0.75x." in text


def test_the_report_counts_the_cpu_each_server_and_the_client_used() -> None:
    cpu = {"server cpu": 2.5, "client cpu": 0.5, "idle": 0.2}
    rows = {
        "in-process": [{"tok/s": 2000.0, "load": 1.0}],
        "served, 1 thread(s)": [served(1500.0) | cpu],
        "served, 2 thread(s)": [served(1200.0) | cpu, served(1300.0) | cpu | {"idle": 0.4}],
        "llama-server, 2 thread(s)": [served(1600.0) | cpu | {"idle": 0.0}],
    }
    text = bound.report(rows, 2, [], time.perf_counter())
    assert "| served, 2 thread(s) | 2.50 | 0.50 | 30 |" in re.sub(" +", " ", text)
    assert "Idle during the burst: served, 1 thread(s) 20%, served, 2 thread(s) 30%" in text
    assert "llama-server, 2 thread(s) 0%." in text
    assert text.split("\n\n")[-1].startswith("Measured on")  # the lesson reads it last


def test_without_cpu_counts_the_report_has_no_cpu_table() -> None:
    rows = {
        "in-process": [{"tok/s": 2000.0, "load": 1.0}],
        "served, 1 thread(s)": [served(1500.0)],
        "served, 2 thread(s)": [served(1200.0)],
    }
    assert "CPU per burst" not in bound.report(rows, 1, [], time.perf_counter())


def test_the_report_sets_the_engine_process_against_the_thread_and_llama_server() -> None:
    rows = {
        "in-process": [{"tok/s": 2000.0, "load": 1.0}],
        "served, 1 thread(s)": [served(1500.0)],
        "served, 2 thread(s)": [served(1200.0)],
        "engine process, 1 thread(s)": [served(1800.0) | {"ttft p99": 1100.0}],
        "engine process, 2 thread(s)": [served(1440.0)],
        "llama-server, 2 thread(s)": [served(1600.0)],
        "llama-server, 1 thread(s)": [served(1200.0)],
    }
    text = bound.report(rows, 1, [], time.perf_counter())
    assert "| engine process, 1 thread(s) | 1,800 " in text
    assert "At the same 1 thread, the engine in its own process streams 1.50x the rate of " in text
    assert "at 1.20x the rate served with it on a thread at 1 thread, and 1.20x at 2." in text
    assert "with the engine in its own process at 1 thread 1.12x" in text
    assert "(TTFT p99 1,100 ms against 1,800), at 2 threads 0.90x." in text
    default = f"engine process, {max(bound.CORES - 1, 1)} thread(s)"
    assert (f"`llmengine serve` as it defaults is the row {default}." in text) == (default in rows)
