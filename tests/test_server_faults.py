"""Faults and shutdowns: an error about one request fails that request alone; an engine loop
that cannot go on tells every open request and makes `serve` exit non-zero; SIGTERM drains
(new requests 503, the ones in flight finish or end with an error event, exit 0); a request
that costs CPU before admission never holds /health."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_helpers import MODEL_NAME, TIMEOUT, Served, served, sse_payloads, wait_until
from test_server_errors import assert_error

import llmengine
import llmengine.runner.model_runner as runner_module
from llmengine.bench.http_client import free_port, wait_for_health
from llmengine.server.engine_loop import EngineLoop

LONG = {"model": MODEL_NAME, "prompt": "ROMEO:", "max_tokens": 60, "ignore_eos": True}
SHORT = {"model": MODEL_NAME, "prompt": "JULIET:", "max_tokens": 3}
PROCESS_TIMEOUT = 60.0


def stream_payloads(url: str, body: dict) -> list[Any]:
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True},
                      timeout=TIMEOUT) as response:  # fmt: skip
        assert response.status_code == 200
        return sse_payloads(response.iter_lines())


def errors_in(payloads: list[Any]) -> list[dict]:
    return [payload["error"] for payload in payloads if "error" in payload]


@pytest.fixture
def fresh(model: llmengine.Llama, tokenizer: Any) -> Iterator[Served]:
    engine = llmengine.Engine(model, num_blocks=32, block_size=16, num_slots=4)
    with served(engine, tokenizer) as running:
        yield running


def test_a_fault_delivering_one_request_fails_that_request_alone(
    fresh: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = EngineLoop._deliver_tokens
    doomed: list[int] = []

    def deliver(self, request_id, *args, **kwargs):  # the first request added is doomed
        if not doomed:
            doomed.append(request_id)
        if request_id == doomed[0]:
            raise RuntimeError("injected fault")
        return real(self, request_id, *args, **kwargs)

    monkeypatch.setattr(EngineLoop, "_deliver_tokens", deliver)
    payloads = stream_payloads(fresh.url, LONG)
    assert errors_in(payloads) and "injected fault" in errors_in(payloads)[0]["message"]
    # The loop goes on: /health is fine and the next requests are served.
    assert httpx.get(f"{fresh.url}/health").status_code == 200
    answer = fresh.post("/v1/completions", SHORT)
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 3
    assert wait_until(lambda: not fresh.engine.has_unfinished() and not fresh.engine._requests)
    assert fresh.engine.num_free_blocks == fresh.engine.num_blocks


def test_non_finite_logits_fail_their_request_and_spare_the_others(
    fresh: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = runner_module.paged_forward
    poisoned: list[bool] = []

    def forward(model, cache, rows, *args, **kwargs):
        logits = real(model, cache, rows, *args, **kwargs)
        both_decoding = len(rows) == 2 and all(len(row.token_ids) == 1 for row in rows)
        if both_decoding and not poisoned:  # the first step they share: poison row 0
            logits[0] = float("nan")
            poisoned.append(True)
        return logits

    results: list[list[Any]] = [[], []]

    def run(index: int) -> None:
        results[index] = stream_payloads(fresh.url, LONG)

    monkeypatch.setattr(runner_module, "paged_forward", forward)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    failed = [payloads for payloads in results if errors_in(payloads)]
    if not poisoned:
        pytest.skip("the two requests never decoded in one step on this run")
    assert len(failed) == 1 and "not finite" in errors_in(failed[0])[0]["message"]
    spared = [payloads for payloads in results if not errors_in(payloads)][0]
    assert spared[-1]["choices"][0]["finish_reason"] == "length"
    assert httpx.get(f"{fresh.url}/health").status_code == 200


def test_a_broken_engine_loop_tells_every_open_request(
    fresh: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    fatal: list[BaseException] = []
    fresh.app.state.engine_loop.on_fatal = fatal.append
    real = EngineLoop._publish

    def publish(self):  # fails once a request is in flight: outside step(), in the loop
        if self._sinks:
            raise RuntimeError("injected loop fault")
        real(self)

    monkeypatch.setattr(EngineLoop, "_publish", publish)
    payloads = stream_payloads(fresh.url, LONG)
    assert "injected loop fault" in errors_in(payloads)[0]["message"]
    assert wait_until(lambda: bool(fatal))
    assert httpx.get(f"{fresh.url}/health").status_code == 503
    assert_error(fresh.post("/v1/completions", SHORT), 503)


def test_draining_refuses_new_requests_with_a_json_503(
    model: llmengine.Llama, tokenizer: Any
) -> None:
    from llmengine.server import create_app, serve_in_thread

    engine = llmengine.Engine(model, num_blocks=32, block_size=16, num_slots=4)
    app = create_app(engine, tokenizer, served_model_name=MODEL_NAME)
    with serve_in_thread(app) as url:
        app.state.drain.begin(60.0)
        assert_error(httpx.post(f"{url}/v1/completions", json=SHORT, timeout=TIMEOUT), 503)
        assert httpx.get(f"{url}/health").status_code == 503
        assert httpx.get(f"{url}/metrics").status_code == 200  # still open for scrapers


def test_health_answers_while_a_costly_request_is_tokenised(fresh: Served) -> None:
    """256 prompts of 3 KB each (under the 1 MB body limit): tokenising them takes a while,
    and /health answers meanwhile, not after."""
    body = {**SHORT, "prompt": ["ROMEO: but soft, what light " * 110] * 256, "max_tokens": 1}
    done = threading.Event()
    statuses: list[int] = []

    def costly() -> None:
        statuses.append(fresh.post("/v1/completions", body).status_code)
        done.set()

    thread = threading.Thread(target=costly)
    thread.start()
    answered_before_done = 0
    for _ in range(200):
        if done.is_set():
            break
        if httpx.get(f"{fresh.url}/health", timeout=TIMEOUT).status_code == 200:
            answered_before_done += not done.is_set()
        time.sleep(0.01)
    thread.join(TIMEOUT)
    assert statuses and statuses[0] in (200, 400, 429)
    assert answered_before_done >= 2


# -- whole processes: `llmengine serve` itself, stopped by a signal or by its own failure ----


def start_process(command: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [part.replace("{port}", str(port)) for part in command]
    process = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(url, process, PROCESS_TIMEOUT)
    except RuntimeError:
        process.kill()
        raise RuntimeError(log.read_text()) from None
    return process, url


def test_sigterm_drains_the_streams_in_flight_then_exits_0(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "llmengine", "serve", "--port", "{port}",
               "--max-num-seqs", "2", "--shutdown-timeout", "1"]  # fmt: skip
    process, url = start_process(command, tmp_path / "serve.log")
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 400}
    chat |= {"ignore_eos": True, "stream": True}
    results: list[list[Any]] = []
    started = threading.Barrier(5)

    def run() -> None:
        address = f"{url}/v1/chat/completions"
        with httpx.stream("POST", address, json=chat, timeout=TIMEOUT) as response:
            lines = response.iter_lines()
            first = next(line for line in lines if line)  # the role chunk: headers are out
            started.wait(TIMEOUT)
            results.append(sse_payloads(iter([first, *lines])))

    try:
        threads = [threading.Thread(target=run) for _ in range(4)]  # 2 run, 2 wait
        for thread in threads:
            thread.start()
        started.wait(TIMEOUT)
        process.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(TIMEOUT)
        assert process.wait(PROCESS_TIMEOUT) == 0
    finally:
        if process.poll() is None:
            process.kill()
    assert len(results) == 4  # every stream ended with [DONE] (sse_payloads checks it)
    for payloads in results:
        last = payloads[-1]
        if "error" in last:
            assert "shut down" in last["error"]["message"]
        else:
            assert last["choices"][0]["finish_reason"] == "length"
    assert any("error" in payloads[-1] for payloads in results)  # 400 tokens outlast 1 s


BROKEN_SERVER = """
import sys
import llmengine
from llmengine.server import create_app, serve
from llmengine.server.engine_loop import EngineLoop

real = EngineLoop._publish

def publish(self):  # the injected fault: the loop fails once a request is in flight
    if self._sinks:
        raise RuntimeError("injected loop fault")
    real(self)

EngineLoop._publish = publish
engine = llmengine.Engine(llmengine.load_model(), num_blocks=32)
app = create_app(engine, llmengine.load_tokenizer(), served_model_name="m")
sys.exit(serve(app, port=int(sys.argv[1]), shutdown_timeout=1))
"""


def test_serve_exits_non_zero_when_its_engine_loop_fails(tmp_path: Path) -> None:
    script = tmp_path / "broken_server.py"
    script.write_text(BROKEN_SERVER)
    process, url = start_process([sys.executable, str(script), "{port}"], tmp_path / "log")
    try:
        payloads = stream_payloads(url, {**LONG, "model": "m"})
        assert "injected loop fault" in errors_in(payloads)[0]["message"]
        assert process.wait(PROCESS_TIMEOUT) == 1
    finally:
        if process.poll() is None:
            process.kill()


def test_an_empty_api_key_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from llmengine.cli import main

    assert main(["serve", "--api-key", ""]) == 2
    assert "--api-key is empty" in capsys.readouterr().err
    environment = {**os.environ, "LLMENGINE_API_KEY": " "}
    command = [sys.executable, "-m", "llmengine", "serve", "--port", "0"]
    done = subprocess.run(
        command, env=environment, capture_output=True, text=True, timeout=PROCESS_TIMEOUT
    )
    assert done.returncode == 2 and "LLMENGINE_API_KEY is empty" in done.stderr


def test_the_help_says_to_prefer_the_environment_for_the_key(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from llmengine.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "Prefer $LLMENGINE_API_KEY" in help_text and "process list" in help_text
