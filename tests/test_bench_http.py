"""`llmengine bench --url` against small servers that misbehave on purpose.

Each stub is a Starlette app on a free local port. They stream known chunks at known delays
(so the timings have lower bounds), stall, drop the connection, answer errors, end without
`[DONE]` or send something that is not JSON: every request must end as a record, completed
or failed with its reason, in bounded time. Then the summary, goodput, Poisson arrival
times, the percentiles, and the CLI's views, options and errors.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from llmengine.bench.http_client import RequestRecord, free_port, run_over_http, served_model
from llmengine.bench.serving_report import (
    format_run_csv,
    format_run_table,
    latency_summary,
    run_summary,
)
from llmengine.bench.timing import percentile
from llmengine.bench.workloads import RequestSpec, poisson_arrivals, uniform_burst
from llmengine.cli import main
from llmengine.sampling import SamplingParams
from llmengine.server import serve_in_thread

STUB_MODEL = "stub-model"
STALL_S = 30.0  # far past every timeout below; a released stub stops waiting at once
LATENCY_KEYS = ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")
STATS = {"mean", "p50", "p90", "p99"}

Handler = Callable[[dict[str, Any], "Stub"], Awaitable[Response]]


@dataclass
class Stub:
    """A running stub: its API root, the bodies and headers it got, and a release switch."""

    url: str = ""
    bodies: list[dict[str, Any]] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)
    released: threading.Event = field(default_factory=threading.Event)

    async def stall(self) -> None:
        """Wait STALL_S seconds, or until the test is done with the stub."""
        for _ in range(int(STALL_S / 0.05)):
            if self.released.is_set():
                return
            await asyncio.sleep(0.05)


@contextmanager
def stub_server(completions: Handler, api_key: str | None = None) -> Iterator[Stub]:
    """`completions` behind POST /v1/completions, with GET /v1/models listing STUB_MODEL.

    With `api_key`, both answer 401 (an OpenAI error object) without `Bearer api_key`.
    """
    stub = Stub()

    def refused(request: Request) -> Response | None:
        authorization = request.headers.get("authorization")
        if api_key is None or authorization == f"Bearer {api_key}":
            return None
        return JSONResponse({"error": {"message": "bad key", "type": "auth"}}, status_code=401)

    async def models(request: Request) -> Response:
        return refused(request) or JSONResponse({"object": "list", "data": [{"id": STUB_MODEL}]})

    async def complete(request: Request) -> Response:
        stub.authorizations.append(request.headers.get("authorization"))
        stub.bodies.append(await request.json())
        return refused(request) or await completions(stub.bodies[-1], stub)

    app = Starlette(
        routes=[
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/completions", complete, methods=["POST"]),
        ]
    )
    with serve_in_thread(app) as base:
        stub.url = f"{base}/v1"
        try:
            yield stub
        finally:
            stub.released.set()


def event(payload: Any) -> bytes:
    """One Server-Sent Event carrying `payload` as JSON."""
    return f"data: {json.dumps(payload)}\n\n".encode()


def text_chunk(text: str) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": None}
    return {"id": "cmpl-1", "object": "text_completion", "choices": [choice]}


def usage_chunk(completion_tokens: int) -> dict[str, Any]:
    usage = {"prompt_tokens": 1, "completion_tokens": completion_tokens, "total_tokens": 1}
    return {"id": "cmpl-1", "object": "text_completion", "choices": [], "usage": usage}


DONE = b"data: [DONE]\n\n"


def sse(events: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream")


async def chunks_at(
    texts: Sequence[str], delays: Sequence[float], usage: int | None
) -> AsyncIterator[bytes]:
    """Each text after its delay, then the usage chunk (if any) and [DONE]."""
    for text, delay in zip(texts, delays, strict=True):
        await asyncio.sleep(delay)
        yield event(text_chunk(text))
    if usage is not None:
        yield event(usage_chunk(usage))
    yield DONE


def streaming(first_delay: float, gap: float) -> Handler:
    """A well-behaved server: `max_tokens` one-letter chunks, the first after `first_delay`."""

    async def handler(body: dict[str, Any], stub: Stub) -> Response:
        n = body["max_tokens"]
        return sse(chunks_at(["t"] * n, [first_delay] + [gap] * (n - 1), usage=n))

    return handler


def burst(n: int = 3, prompt_len: int = 4, max_tokens: int = 5) -> list[RequestSpec]:
    return uniform_burst(n, prompt_len, max_tokens, vocab_size=1000)


# --- a well-behaved stream: counts and timings -----------------------------------------------

DELAYS = (0.1, 0.02, 0.02, 0.02, 0.02)


def test_every_chunk_is_timed_and_counted() -> None:
    async def handler(body: dict[str, Any], stub: Stub) -> Response:
        return sse(chunks_at("abcde", DELAYS, usage=5))

    workload = burst(3, prompt_len=4, max_tokens=5)
    with stub_server(handler) as stub:
        run = run_over_http(stub.url, STUB_MODEL, workload, timeout=10)
    assert len(run.records) == 3
    for record in run.records:
        assert record.ok, record.error
        assert record.output_tokens == 5 and record.text == "abcde"
        assert record.prompt_tokens == 4
        assert len(record.itl) == len(DELAYS) - 1
        assert record.ttft >= DELAYS[0]
        assert record.e2e >= sum(DELAYS)
        assert record.ttft + sum(record.itl) == pytest.approx(record.e2e)
        assert record.tpot == pytest.approx((record.e2e - record.ttft) / 4)
    assert run.duration >= sum(DELAYS)
    assert sorted(map(tuple, (body["prompt"] for body in stub.bodies))) == sorted(
        spec.prompt_token_ids for spec in workload
    )
    for body in stub.bodies:
        assert body["model"] == STUB_MODEL and body["max_tokens"] == 5
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        assert body["temperature"] == 0.0 and body["ignore_eos"] is True


@pytest.mark.parametrize(("usage", "tokens"), [(3, 3), (None, 2)])
def test_usage_counts_the_tokens_when_a_chunk_carries_two(usage: int | None, tokens: int) -> None:
    """Two chunks, the second with two tokens' text: usage says 3; without usage, 2 chunks."""

    async def handler(body: dict[str, Any], stub: Stub) -> Response:
        return sse(chunks_at(["x", "yz"], [0.0, 0.01], usage=usage))

    with stub_server(handler) as stub:
        (record,) = run_over_http(stub.url, STUB_MODEL, burst(1), timeout=10).records
    assert record.ok, record.error
    assert (record.output_tokens, len(record.itl), record.text) == (tokens, 1, "xyz")


# --- servers that misbehave: every request a failed record, in bounded time ------------------


async def stall_before(body: dict[str, Any], stub: Stub) -> Response:
    await stub.stall()
    return PlainTextResponse("too late")


async def stall_during(body: dict[str, Any], stub: Stub) -> Response:
    async def events() -> AsyncIterator[bytes]:
        yield event(text_chunk("a"))
        await stub.stall()
        yield DONE

    return sse(events())


@pytest.mark.parametrize("handler", [stall_before, stall_during])
def test_a_stalled_server_times_every_request_out(handler: Handler) -> None:
    with stub_server(handler) as stub:
        run = run_over_http(stub.url, STUB_MODEL, burst(3), timeout=1)
    assert 1 <= run.duration < 3
    # The request's own deadline is armed before httpx's read timer, so it fires first.
    assert [record.error for record in run.records] == ["no complete answer within 1 s"] * 3


async def drop_after_two_chunks(body: dict[str, Any], stub: Stub) -> Response:
    async def events() -> AsyncIterator[bytes]:
        yield event(text_chunk("a"))
        yield event(text_chunk("b"))
        raise RuntimeError("the stub drops the connection")

    return sse(events())


async def partial_body_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An ASGI app that starts a chunked stream, sends two events and returns unfinished."""
    if scope["type"] != "http":
        return
    headers = [(b"content-type", b"text/event-stream")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    for text in "ab":
        body = event(text_chunk(text))
        await send({"type": "http.response.body", "body": body, "more_body": True})


DROPPED = ("RemoteProtocolError: ", "ReadError")  # a closed or a reset connection


def test_a_stream_that_raises_midway_is_a_failed_request() -> None:
    with stub_server(drop_after_two_chunks) as stub:
        run = run_over_http(stub.url, STUB_MODEL, burst(2), timeout=10)
    assert run.duration < 5
    assert all(not record.ok for record in run.records)
    assert all(record.error.startswith(DROPPED) for record in run.records)


def test_a_response_left_unfinished_is_a_failed_request() -> None:
    with serve_in_thread(partial_body_app) as base:
        run = run_over_http(f"{base}/v1", STUB_MODEL, burst(2), timeout=10)
    assert run.duration < 5
    assert all(not record.ok for record in run.records)
    assert all(record.error.startswith(DROPPED) for record in run.records)


async def answer_500(body: dict[str, Any], stub: Stub) -> Response:
    return PlainTextResponse("boom", status_code=500)


async def answer_429(body: dict[str, Any], stub: Stub) -> Response:
    error = {"message": "queue full", "type": "rate_limit_error", "code": "queue_full"}
    return JSONResponse({"error": error}, status_code=429)


async def answer_json(body: dict[str, Any], stub: Stub) -> Response:
    return JSONResponse({"choices": [{"text": "not streamed"}]})


def answering(*parts: bytes) -> Handler:
    async def handler(body: dict[str, Any], stub: Stub) -> Response:
        async def events() -> AsyncIterator[bytes]:
            for part in parts:
                yield part

        return sse(events())

    return handler


NO_DONE = "the stream ended without data: [DONE]"


@pytest.mark.parametrize(
    ("handler", "error"),
    [
        (answer_500, "HTTP 500: boom"),
        (answer_429, "HTTP 429: queue full"),
        (answer_json, NO_DONE),
        (answering(event(text_chunk("a")), event(text_chunk("b"))), NO_DONE),
        (answering(DONE), "the stream carried no tokens"),
        (answering(event(usage_chunk(0)), DONE), "the stream carried no tokens"),
        (answering(b"data: hello\n\n", DONE), "not an OpenAI stream: "),
        (answering(event([1, 2]), DONE), "not an OpenAI stream: an event that is not"),
        (answering(event({"choices": [{"text": 1}]}), DONE), "not an OpenAI stream: "),
        (answering(event({"error": {"message": "gone"}}), DONE), "error event: "),
    ],
    ids=[
        "500", "429", "not-a-stream", "no-done", "no-tokens", "usage-only", "not-json",
        "not-an-object", "text-not-a-string", "error-event",
    ],
)  # fmt: skip
def test_a_wrong_answer_is_a_failed_request(handler: Handler, error: str) -> None:
    with stub_server(handler) as stub:
        run = run_over_http(stub.url, STUB_MODEL, burst(2), timeout=10)
    assert [record.ok for record in run.records] == [False, False]
    assert all(record.error.startswith(error) for record in run.records), run.records[0].error


def test_nobody_listening_fails_every_request_fast() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    run = run_over_http(url, STUB_MODEL, burst(3), timeout=10)
    assert run.duration < 3
    assert all(record.error.startswith("ConnectError") for record in run.records)
    with pytest.raises(OSError, match="cannot list the models"):
        served_model(url, timeout=5)


BAD_URLS = [
    "localhost:8000/v1", "http:///v1", "http://[::1/v1", "http://127.0.0.1:99999/v1",
    "ftp://example.com/v1", "nonsense",
]  # fmt: skip


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_url_that_names_no_server_is_a_value_error(url: str) -> None:
    with pytest.raises(ValueError, match="URL"):
        run_over_http(url, STUB_MODEL, burst(1), timeout=5)
    with pytest.raises(ValueError, match="URL"):
        served_model(url, timeout=5)


def test_a_trailing_slash_is_the_same_api_root() -> None:
    with stub_server(streaming(0.0, 0.0)) as stub:
        assert served_model(f"{stub.url}/") == STUB_MODEL
        run = run_over_http(f"{stub.url}/", STUB_MODEL, burst(1), timeout=10)
    assert run.records[0].ok, run.records[0].error


def test_a_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="timeout must be positive"):
        run_over_http("http://127.0.0.1:1/v1", STUB_MODEL, burst(1), timeout=0)


# --- summaries: counts, errors, goodput ------------------------------------------------------

# By prompt length: fast; slow first token; slow tokens after it; an error.
FAST, SLOW_FIRST, SLOW_GAPS, BROKEN = 1, 2, 3, 4
TIMINGS = {FAST: (0.0, 0.01), SLOW_FIRST: (0.4, 0.01), SLOW_GAPS: (0.0, 0.12)}


async def by_prompt_length(body: dict[str, Any], stub: Stub) -> Response:
    length = len(body["prompt"])
    if length == BROKEN:
        return await answer_500(body, stub)
    first, gap = TIMINGS[length]
    return await streaming(first, gap)(body, stub)


def mixed_workload() -> list[RequestSpec]:
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    lengths = [FAST, SLOW_FIRST, SLOW_GAPS, BROKEN, FAST, SLOW_FIRST]
    return [RequestSpec(tuple(range(length)), params) for length in lengths]


def test_the_summary_counts_failures_and_goodput_follows_the_slos() -> None:
    with stub_server(by_prompt_length) as stub:
        run = run_over_http(stub.url, STUB_MODEL, mixed_workload(), timeout=10)
    assert [record.ok for record in run.records] == [True, True, True, False, True, True]
    summary = run_summary(run)
    assert (summary["requests"], summary["completed"], summary["failed"]) == (6, 5, 1)
    assert summary["errors"] == ["HTTP 500: boom"]
    assert summary["output_tokens"] == 5 * 4
    assert summary["input_tokens"] == FAST * 2 + SLOW_FIRST * 2 + SLOW_GAPS
    assert summary["request_throughput"] == pytest.approx(5 / run.duration)
    assert summary["output_token_throughput"] == pytest.approx(20 / run.duration)
    assert summary["request_rate"] is None and "goodput" not in summary
    done = [record for record in run.records if record.ok]
    assert summary["ttft_ms"] == latency_summary([record.ttft for record in done])
    assert summary["itl_ms"] == latency_summary([gap for record in done for gap in record.itl])
    assert summary["e2e_ms"]["p99"] == pytest.approx(
        percentile([1000 * record.e2e for record in done], 99)
    )

    def good(**slos: float) -> int:
        result = run_summary(run, **slos)
        assert result["goodput"] == pytest.approx(result["good_requests"] / run.duration)
        return result["good_requests"]

    assert good(slo_ttft_ms=200) == 3  # the fast ones and the slow-gaps one
    assert good(slo_tpot_ms=60) == 4  # the fast ones and the slow-first ones
    assert good(slo_ttft_ms=200, slo_tpot_ms=60) == 2
    assert good(slo_ttft_ms=1e6, slo_tpot_ms=1e6) == 5  # a failed request is never good


def test_the_table_and_csv_views_of_a_run() -> None:
    with stub_server(by_prompt_length) as stub:
        run = run_over_http(stub.url, STUB_MODEL, mixed_workload(), timeout=10)
    summaries = [run_summary(run, slo_ttft_ms=200), run_summary(run, request_rate=2.5)]
    header, *rows, failed = format_run_table(summaries).splitlines()
    assert len({len(line) for line in (header, *rows)}) == 1
    assert header.split()[-1] == "goodput" and "ttft p50" in header
    assert rows[0].split()[:3] == ["all", "5", "1"] and rows[1].split()[0] == "2.5"
    assert rows[1].split()[-1] == "n/a"
    assert failed == "failed: HTTP 500: boom"
    parsed = list(csv.DictReader(io.StringIO(format_run_csv(summaries))))
    assert [row["request_rate"] for row in parsed] == ["", "2.5"]
    assert float(parsed[0]["ttft_ms_p50"]) == pytest.approx(summaries[0]["ttft_ms"]["p50"])
    assert parsed[0]["errors"] == "HTTP 500: boom"
    later_only = list(csv.DictReader(io.StringIO(format_run_csv(summaries[::-1]))))
    assert later_only[0]["goodput"] == "" and float(later_only[1]["goodput"]) >= 0


def test_a_run_with_nothing_completed_reports_no_latencies() -> None:
    with stub_server(answer_500) as stub:
        summary = run_summary(run_over_http(stub.url, STUB_MODEL, burst(2), timeout=10))
    assert (summary["completed"], summary["failed"], summary["output_tokens"]) == (0, 2, 0)
    assert all(set(summary[key].values()) == {None} for key in LATENCY_KEYS)
    assert "n/a" in format_run_table([summary]).splitlines()[1]


# --- arrivals --------------------------------------------------------------------------------


def test_requests_start_at_their_poisson_arrival_times() -> None:
    workload = poisson_arrivals(burst(6, max_tokens=2), 10.0, seed=3)
    arrivals = [spec.arrival for spec in workload]
    assert arrivals[-1] > 0.2  # spread out, not a burst
    with stub_server(streaming(0.0, 0.0)) as stub:
        run = run_over_http(stub.url, STUB_MODEL, workload, timeout=10)
    assert all(record.ok for record in run.records)
    for record, arrival in zip(run.records, arrivals, strict=True):
        assert arrival - 0.005 <= record.start <= arrival + 0.1
    assert run.duration >= arrivals[-1]


def test_a_burst_starts_at_once() -> None:
    with stub_server(streaming(0.0, 0.0)) as stub:
        run = run_over_http(stub.url, STUB_MODEL, burst(5, max_tokens=2), timeout=10)
    assert all(record.ok and record.start < 0.1 for record in run.records)


# --- percentiles -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([1, 2, 3, 4], 50, 2.5),
        ([1, 2, 3, 4], 90, 3.7),  # rank 0.9 * 3 = 2.7: 3 + 0.7 * (4 - 3)
        ([1, 2, 3, 4], 99, 3.97),
        ([4, 1, 3, 2], 0, 1),
        ([4, 1, 3, 2], 100, 4),
        ([10, 20], 25, 12.5),
        ([7], 99, 7),
        ([1, 1, 2, 10], 75, 4.0),  # rank 2.25: 2 + 0.25 * (10 - 2)
    ],
)
def test_percentile_interpolates_linearly_between_ranks(
    values: list[float], q: float, expected: float
) -> None:
    assert percentile(values, q) == pytest.approx(expected)


def test_percentile_refuses_nothing_and_out_of_range() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match=r"\[0, 100\]"):
        percentile([1.0], 101)


def test_latency_summary_is_in_milliseconds_and_none_when_empty() -> None:
    assert latency_summary([]) == {"mean": None, "p50": None, "p90": None, "p99": None}
    summary = latency_summary([0.003, 0.001])
    assert summary == pytest.approx({"mean": 2.0, "p50": 2.0, "p90": 2.8, "p99": 2.98})


def test_tpot_needs_two_tokens() -> None:
    assert RequestRecord(1, output_tokens=1, ttft=0.1, e2e=0.1).tpot is None
    assert RequestRecord(1, output_tokens=3, ttft=0.1, e2e=0.5).tpot == pytest.approx(0.2)


# --- the command line ------------------------------------------------------------------------

SHAPE = ["--requests", "3", "--prompt-len", "4", "--max-tokens", "5"]


@pytest.fixture
def no_env_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


@pytest.fixture
def stub(no_env_key: None) -> Iterator[Stub]:
    with stub_server(streaming(0.01, 0.005)) as running:
        yield running


def bench(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> tuple[int, str, str]:
    status = main(["bench", "--url", url, *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_json_has_the_contract_keys(stub: Stub, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = bench(capsys, stub.url, *SHAPE, "--format", "json")
    assert status == 0
    summary = json.loads(out)
    assert (summary["completed"], summary["failed"], summary["output_tokens"]) == (3, 0, 15)
    assert summary["request_throughput"] > 0 and summary["output_token_throughput"] > 0
    for key in LATENCY_KEYS:
        assert set(summary[key]) == STATS and all(v > 0 for v in summary[key].values())
    assert summary["ttft_ms"]["p50"] >= 10
    assert [body["model"] for body in stub.bodies] == [STUB_MODEL] * 3  # from GET /models
    assert all(len(body["prompt"]) == 4 and max(body["prompt"]) < 1000 for body in stub.bodies)


def test_the_model_option_is_sent_as_given(stub: Stub, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, _ = bench(capsys, stub.url, *SHAPE, "--model", "other", "--format", "json")
    assert status == 0 and {body["model"] for body in stub.bodies} == {"other"}


def test_a_rate_sweep_prints_one_object_per_rate_and_plots(
    stub: Stub, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    plot = tmp_path / "curve.png"
    args = ["--requests", "2", "--prompt-len", "3", "--max-tokens", "3"]
    status, out, _ = bench(
        capsys, stub.url, *args, "--request-rates", "2,4", "--format", "json", "--plot", str(plot)
    )
    assert status == 0
    runs = json.loads(out)
    assert [run["request_rate"] for run in runs] == [2, 4]
    assert all(run["completed"] == 2 for run in runs)
    assert plot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_csv_has_flattened_latencies(stub: Stub, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = bench(capsys, stub.url, *SHAPE, "--request-rate", "50", "--format", "csv")
    assert status == 0
    (row,) = csv.DictReader(io.StringIO(out))
    assert "ttft_ms_p50" in row and float(row["ttft_ms_p50"]) > 0
    assert (row["completed"], row["request_rate"]) == ("3", "50.0")


def test_the_table_names_the_run(stub: Stub, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = bench(capsys, stub.url, *SHAPE, "--slo-ttft-ms", "5000")
    assert status == 0
    title, header, row = out.splitlines()
    assert title.startswith(f"{stub.url}, model {STUB_MODEL}: 3 requests, arriving together")
    assert header.split()[-1] == "goodput"
    assert row.split()[:3] == ["all", "3", "0"]


def test_failed_requests_exit_1_and_are_listed(
    no_env_key: None, capsys: pytest.CaptureFixture[str]
) -> None:
    with stub_server(answer_500) as stub:
        status, out, _ = bench(capsys, stub.url, *SHAPE)
    assert status == 1
    assert out.splitlines()[-1] == "failed: HTTP 500: boom"
    assert out.splitlines()[2].split()[:3] == ["all", "0", "3"]


def test_the_timeout_option_bounds_each_request(
    no_env_key: None, capsys: pytest.CaptureFixture[str]
) -> None:
    with stub_server(stall_during) as stub:
        status, out, _ = bench(capsys, stub.url, *SHAPE, "--timeout", "1", "--format", "json")
    assert status == 1
    summary = json.loads(out)
    assert summary["failed"] == 3 and summary["duration_s"] < 3
    assert len(summary["errors"]) == 1 and "within 1 s" in summary["errors"][0]


def test_nobody_listening_exits_2_naming_the_models_list(
    no_env_key: None, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = bench(capsys, f"http://127.0.0.1:{free_port()}/v1", *SHAPE, "--timeout", "5")
    assert status == 2 and "cannot list the models" in err


@pytest.mark.parametrize("model", [[], ["--model", "m"]], ids=["listed", "named"])
@pytest.mark.parametrize("url", BAD_URLS)
def test_a_bad_url_exits_2_with_a_message(
    url: str, model: list[str], no_env_key: None, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = bench(capsys, url, *SHAPE, *model, "--timeout", "5")
    assert status == 2 and err.startswith("llmengine bench: error: not ")
    assert url in err


def test_the_api_key_is_sent_as_a_bearer_token(
    no_env_key: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with stub_server(streaming(0.0, 0.0), api_key="sekret") as stub:
        status, _, err = bench(capsys, stub.url, *SHAPE)
        assert status == 2 and "HTTP 401: bad key" in err
        status, out, _ = bench(capsys, stub.url, *SHAPE, "--model", STUB_MODEL)
        assert status == 1 and "failed: HTTP 401: bad key" in out
        assert set(stub.authorizations) == {None}
        stub.authorizations.clear()
        assert bench(capsys, stub.url, *SHAPE, "--api-key", "sekret")[0] == 0
        monkeypatch.setenv("OPENAI_API_KEY", "sekret")
        assert bench(capsys, stub.url, *SHAPE)[0] == 0
        assert stub.authorizations == ["Bearer sekret"] * 6


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--url", "http://127.0.0.1:1/v1", "--pools", "8"], "--pools not used with --url"),
        (["--url", "http://127.0.0.1:1/v1", "--device", "cpu", "--dtype", "bfloat16"],
         "--device, --dtype not used with --url"),
        (["--url", "http://127.0.0.1:1/v1", "--kernels", "eager", "--quantization", "int8"],
         "--kernels, --quantization not used with --url"),
        (["--url", "http://127.0.0.1:1/v1", "--decode-graph"],
         "--decode-graph not used with --url"),
        (
            ["--url", "http://127.0.0.1:1/v1", "--request-rate", "2", "--request-rates", "2,4"],
            "--request-rate or --request-rates, not both",
        ),
        (["--block-size", "4", "--pools", "8"], "--slots required without --url"),
        (["--slots", "2", "--block-size", "4", "--pools", "8", "--request-rate", "2"],
         "--request-rate not used without --url"),
        (["--slots", "2", "--block-size", "4", "--pools", "8", "--vocab-size", "50"],
         "--vocab-size not used without --url"),
        (["--slots", "2", "--block-size", "4", "--pools", "8", "--seed", "1"],
         "--seed not used without --url"),
    ],
)  # fmt: skip
def test_options_of_the_other_mode_exit_2_with_a_message(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", *SHAPE, *args]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--request-rate", "0"], "--request-rate: must be positive, got 0"),
        (["--request-rate", "fast"], "--request-rate: expected requests per second"),
        (["--request-rates", "2,-1"], "--request-rates: must be positive, got -1"),
        (["--timeout", "0"], "--timeout: must be a positive number"),
        (["--slo-ttft-ms", "nan"], "--slo-ttft-ms: must be a positive number"),
    ],
)
def test_bad_numbers_are_argparse_errors(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--url", "http://127.0.0.1:1/v1", *SHAPE, *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_an_infinite_rate_is_a_burst(stub: Stub, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = bench(capsys, stub.url, *SHAPE, "--request-rate", "inf")
    assert status == 0
    title, _, row = out.splitlines()
    assert "3 requests, arriving together" in title and row.split()[0] == "all"
    status, out, _ = bench(capsys, stub.url, *SHAPE, "--request-rates", "inf", "--format", "json")
    assert status == 0 and [run["request_rate"] for run in json.loads(out)] == [None]
