"""What `llmengine bench --url` prints: latency percentiles, throughput and goodput of a run.

The summary's keys are the contract's JSON fields (`completed`, `failed`,
`request_throughput`, `output_token_throughput`, and `ttft_ms`, `itl_ms`, `tpot_ms`,
`e2e_ms`, each with `mean`, `p50`, `p90`, `p99`); the table and the CSV are views of the same
dictionaries. Percentiles interpolate linearly between ranks (`timing.percentile`), as
numpy's default does.
Inter-token gaps are pooled over every request; time per output token is one value per
request. Goodput counts the completed requests that met every SLO given, per second.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llmengine.bench.http_client import HttpRun, RequestRecord
from llmengine.bench.report import aligned_lines, csv_text
from llmengine.bench.timing import percentile

PERCENTILES = (50, 90, 99)
LATENCIES = ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")


def latency_summary(seconds: Sequence[float]) -> dict[str, float | None]:
    """Mean and percentiles in milliseconds; every value None when there are no samples."""
    if not seconds:
        return {"mean": None, **{f"p{q}": None for q in PERCENTILES}}
    millis = [1000 * value for value in seconds]
    summary = {"mean": sum(millis) / len(millis)}
    return summary | {f"p{q}": percentile(millis, q) for q in PERCENTILES}


def _meets(record: RequestRecord, slo_ttft_ms: float | None, slo_tpot_ms: float | None) -> bool:
    if not record.ok:
        return False
    if slo_ttft_ms is not None and 1000 * record.ttft > slo_ttft_ms:
        return False
    tpot = record.tpot
    return slo_tpot_ms is None or tpot is None or 1000 * tpot <= slo_tpot_ms


def run_summary(
    run: HttpRun,
    *,
    request_rate: float = math.inf,
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
) -> dict[str, Any]:
    """One run as the JSON object `llmengine bench --url --format json` prints.

    `request_rate` is the offered rate (inf for all at once), reported as null when infinite
    so that the JSON is standard. Throughputs are over the run's wall-clock duration.
    """
    done = [record for record in run.records if record.ok]
    errors = [record.error for record in run.records if not record.ok]
    duration = run.duration
    output_tokens = sum(record.output_tokens for record in done)
    summary: dict[str, Any] = {
        "request_rate": None if math.isinf(request_rate) else request_rate,
        "requests": len(run.records),
        "completed": len(done),
        "failed": len(errors),
        "duration_s": duration,
        "input_tokens": sum(record.prompt_tokens for record in done),
        "output_tokens": output_tokens,
        "request_throughput": len(done) / duration if duration > 0 else 0.0,
        "output_token_throughput": output_tokens / duration if duration > 0 else 0.0,
        "ttft_ms": latency_summary([record.ttft for record in done]),
        "itl_ms": latency_summary([gap for record in done for gap in record.itl]),
        "tpot_ms": latency_summary([r.tpot for r in done if r.tpot is not None]),
        "e2e_ms": latency_summary([record.e2e for record in done]),
        "slo_ttft_ms": slo_ttft_ms,
        "slo_tpot_ms": slo_tpot_ms,
    }
    if slo_ttft_ms is not None or slo_tpot_ms is not None:
        good = sum(_meets(record, slo_ttft_ms, slo_tpot_ms) for record in run.records)
        summary["good_requests"] = good
        summary["goodput"] = good / duration if duration > 0 else 0.0
    summary["errors"] = sorted(set(errors))
    return summary


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def format_run_table(summaries: Sequence[dict[str, Any]]) -> str:
    """Runs as an aligned table, one row per run (per rate in a sweep), then any errors."""
    headers = ["rate", "done", "failed", "req/s", "tok/s"]
    headers += [f"{name[:-3]} {stat}" for name in LATENCIES for stat in ("mean", "p50", "p99")]
    goodput = any("goodput" in summary for summary in summaries)
    if goodput:
        headers.append("goodput")
    rows = [headers]
    for summary in summaries:
        rate = summary["request_rate"]
        row = ["all" if rate is None else f"{rate:g}", str(summary["completed"])]
        row += [str(summary["failed"]), f"{summary['request_throughput']:.2f}"]
        row.append(f"{summary['output_token_throughput']:.1f}")
        row += [_ms(summary[name][stat]) for name in LATENCIES for stat in ("mean", "p50", "p99")]
        if goodput:
            row.append(f"{summary['goodput']:.2f}" if "goodput" in summary else "n/a")
        rows.append(row)
    lines = aligned_lines(rows)
    errors = sorted({error for summary in summaries for error in summary["errors"]})
    lines += [f"failed: {error}" for error in errors]
    return "\n".join(lines)


def _flat(summary: dict[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in summary.items():
        if isinstance(value, dict):
            flat |= {f"{key}_{stat}": number for stat, number in value.items()}
        elif isinstance(value, list):
            flat[key] = " | ".join(value)
        else:
            flat[key] = value
    return flat


def format_run_csv(summaries: Sequence[dict[str, Any]]) -> str:
    """Runs as CSV: the JSON's fields, latency objects flattened (`ttft_ms_p50`), None empty."""
    return csv_text([_flat(summary) for summary in summaries])


def plot_latency_throughput(summaries: Sequence[dict[str, Any]], path: Path | None = None) -> Any:
    """The latency-throughput curve of a rate sweep: one point per offered rate.

    Left, time to first token (p50 and p99); right, time per output token (p50 and p99);
    both against the output tokens per second achieved. Returns the matplotlib figure,
    saved to `path` when one is given. matplotlib is imported only here.
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    points = [summary for summary in summaries if summary["completed"]]
    throughput = [summary["output_token_throughput"] for summary in points]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
    for ax, name, title in zip(
        axes, ("ttft_ms", "tpot_ms"), ("time to first token", "time per output token"),
        strict=True,
    ):  # fmt: skip
        for stat, style in (("p50", "o-"), ("p99", "s--")):
            values = [math.nan if s[name][stat] is None else s[name][stat] for s in points]
            ax.plot(throughput, values, style, label=stat)
        for summary, x in zip(points, throughput, strict=True):
            rate, y = summary["request_rate"], summary[name]["p50"]
            if y is not None:
                label = "all" if rate is None else f"{rate:g}/s"
                ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.set_xlabel("output tokens per second")
        ax.set_ylabel("milliseconds")
        ax.set_title(title)
        ax.legend()
    if path is not None:
        fig.savefig(path, metadata={"Software": None})
    return fig
