"""`llmengine serve`, whose engine runs in a child process by default, the HTTP side in the
server's, one pipe between them: the same answers as the engine on a thread, adds refused
across the pipe, the metrics and the live feed read from the child, a clean stop, and a child
that dies ending what was in flight and the server with it. And the forward's threads, which
leave the HTTP side one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import torch
from server_helpers import served, sse_payloads

import llmengine
from llmengine.bench.http_client import free_port, wait_for_health
from llmengine.cli import build_parser
from llmengine.cli import serve as serve_command
from llmengine.cli.serve import forward_threads
from llmengine.lessons.live_server import metric_samples, read_metrics

ROOT = Path(__file__).resolve().parent.parent
NAME = "tiny-test"  # server_helpers' model name, so that one body serves both servers
SLOTS, WAITING = 2, 1
PROMPTS = ["ROMEO:", "JULIET:\nO", "First Citizen:"]  # at once: two seated, one waiting


def serve(*flags: str, threads: int | None = None, **popen: object) -> subprocess.Popen:
    """`llmengine serve` as it defaults, with `flags`, on `threads` OpenMP threads (None: the
    test run's), once healthy; its stdout and stderr are one pipe."""
    port = free_port()
    command = [sys.executable, "-m", "llmengine", "serve", "--port", str(port),
               "--num-blocks", "64", "--max-num-seqs", str(SLOTS), "--max-waiting",
               str(WAITING), "--served-model-name", NAME, *flags]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    server = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen
    )
    server.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    try:
        wait_for_health(server.url, server, timeout=120)  # type: ignore[attr-defined]
    except RuntimeError:
        server.kill()
        raise AssertionError(server.communicate(timeout=10)[0]) from None
    return server


def spawned_children(server: subprocess.Popen) -> list[int]:
    """The processes the server spawned with multiprocessing (beside its resource tracker)."""
    return [
        int(pid)
        for task in Path(f"/proc/{server.pid}/task").glob("*/children")
        for pid in task.read_text().split()
        if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]


def engine_pid(server: subprocess.Popen) -> int:
    """The engine's process: the one child the server spawned."""
    children = spawned_children(server)
    assert len(children) == 1, children
    return children[0]


def forward_threads_said(server: subprocess.Popen) -> int:
    """The forward's thread count, as the server says it on start-up (before it is healthy)."""
    for _ in range(200):
        line = server.stdout.readline()  # type: ignore[union-attr]
        if line.startswith("llmengine: the engine's forward runs on "):
            return int(line.split(" runs on ")[1].split()[0])
    raise AssertionError("the server never said its forward's thread count")


@contextmanager
def serving(*flags: str, threads: int | None = None, **popen: object) -> Iterator[subprocess.Popen]:
    """`serve`, killed on the way out if it is still running."""
    server = serve(*flags, threads=threads, **popen)
    try:
        yield server
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)


@contextmanager
def stream_under_way(server: subprocess.Popen) -> Iterator[Iterator[str]]:
    """A long stream from `server` whose first token has arrived: the rest of its lines."""
    body = {"model": NAME, "prompt": "ROMEO:", "max_tokens": 200, "ignore_eos": True,
            "stream": True}  # fmt: skip
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as answer:
        lines = answer.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        yield lines


@pytest.fixture(scope="module")
def server() -> Iterator[subprocess.Popen]:
    with serving() as server:
        yield server


def completion(url: str, prompt: str, **fields: object) -> dict:
    body = {"model": NAME, "prompt": prompt, "max_tokens": 12, "temperature": 0, **fields}
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_greedy_answers_equal_those_of_the_engine_on_a_thread(server: subprocess.Popen) -> None:
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        apart = list(pool.map(lambda prompt: completion(server.url, prompt), PROMPTS))
    engine = llmengine.Engine(llmengine.load_model(), num_blocks=64, num_slots=SLOTS)
    with served(engine, llmengine.load_tokenizer()) as local:
        on_a_thread = [completion(local.url, prompt) for prompt in PROMPTS]
    texts = [answer["choices"][0]["text"] for answer in apart]
    assert texts == [answer["choices"][0]["text"] for answer in on_a_thread]
    assert all(answer["usage"]["completion_tokens"] == 12 for answer in apart)


def test_a_stop_string_aborts_in_the_child_and_its_metrics_say_so(
    server: subprocess.Popen,
) -> None:
    text = completion(server.url, "ROMEO:", max_tokens=40)["choices"][0]["text"]
    stop = text[len(text) // 2 :][:3]  # something the greedy text is sure to reach
    before = read_metrics(server.url).get('llmengine_requests_finished_total{reason="stop"}', 0)
    body = {"model": NAME, "prompt": "ROMEO:", "max_tokens": 40, "temperature": 0,
            "stop": [stop], "stream": True}  # fmt: skip
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as answer:
        payloads = sse_payloads(answer.iter_lines())
    assert payloads[-1]["choices"][0]["finish_reason"] == "stop"
    after = read_metrics(server.url)
    assert after['llmengine_requests_finished_total{reason="stop"}'] == before + 1
    assert after["llmengine_requests_running"] == 0


def test_an_add_past_the_waiting_bound_is_refused_across_the_pipe(
    server: subprocess.Popen,
) -> None:
    """Two slots and one waiting place: of four long requests at once, one gets 429."""
    body = {"model": NAME, "prompt": "ROMEO:", "max_tokens": 300, "ignore_eos": True}

    def post(_: int) -> int:
        return httpx.post(f"{server.url}/v1/completions", json=body, timeout=120).status_code

    with ThreadPoolExecutor(4) as pool:
        codes = sorted(pool.map(post, range(4)))
    assert codes == [200, 200, 200, 429]


def test_the_live_feed_comes_from_the_child(server: subprocess.Popen) -> None:
    with httpx.stream("GET", f"{server.url}/v1/engine/events", timeout=30) as feed:
        snapshot = next(
            json.loads(line[len("data: ") :])
            for line in feed.iter_lines()
            if line.startswith("data: ")
        )
    assert snapshot["pool"]["size"] == 64
    assert {"running", "waiting", "events", "rates", "step_ms"} <= snapshot.keys()


def test_constraints_are_checked_on_the_server_side_and_kept_in_the_child(
    server: subprocess.Popen,
) -> None:
    """The grammar compiler crosses the pipe with the engine's facts: a schema that does not
    compile is a 400 before the child sees it, and a choice holds the text to its options."""
    bad = {"type": "json_schema", "json_schema": {"name": "s", "schema": {"$ref": "#/nowhere"}}}
    body = {"model": NAME, "prompt": "ROMEO:", "max_tokens": 8, "response_format": bad}
    refused = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert refused.status_code == 400 and "/nowhere" in refused.json()["error"]["message"]
    choice = completion(server.url, "ROMEO:", structured_outputs={"choice": ["aye", "nay"]})
    assert choice["choices"][0]["text"] in ("aye", "nay")
    assert choice["choices"][0]["finish_reason"] == "stop"


def test_sigterm_stops_the_server_and_its_engine_process(server: subprocess.Popen) -> None:
    child = engine_pid(server)
    server.send_signal(signal.SIGTERM)
    output, _ = server.communicate(timeout=60)
    assert server.returncode == 0, output
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists(), "the engine process outlived the server"


def test_an_engine_process_that_dies_ends_the_requests_in_flight_and_the_server() -> None:
    with serving() as server:
        with stream_under_way(server) as lines:
            os.kill(engine_pid(server), signal.SIGKILL)
            rest = [line for line in lines if line.startswith("data: ")]
        errors = [json.loads(line[6:]) for line in rest if line.startswith('data: {"error"')]
        assert errors, rest[-3:]
        assert server.wait(30) == 1


def test_the_engine_runs_in_a_process_of_its_own_unless_told_otherwise() -> None:
    with serving() as server:
        assert engine_pid(server) > 0
    with serving("--no-engine-process") as server:
        assert spawned_children(server) == []
        body = {"model": NAME, "prompt": "ROMEO:", "max_tokens": 3}
        assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).status_code == 200


@pytest.mark.parametrize(
    ("flags", "threads", "forward"),
    [((), 2, 1), (("--engine-threads", "2"), 1, 2), (("--no-engine-process",), 2, 1)],
)
def test_the_forward_leaves_the_http_side_a_thread_unless_told_its_count(
    flags: tuple[str, ...], threads: int, forward: int
) -> None:
    # torch takes at most the cores' count from OMP_NUM_THREADS: 2 threads on 2 or more cores
    # leave the forward 1, where all of them would be 2.
    with serving(*flags, threads=threads) as server:
        assert forward_threads_said(server) == forward


def test_the_forward_threads_are_the_ones_asked_for_else_all_but_one_and_at_least_one() -> None:
    assert [forward_threads(None, available) for available in (1, 2, 3, 16)] == [1, 1, 2, 15]
    assert forward_threads(4, 2) == 4  # asked for: taken as it is, more than the cores or not


@pytest.fixture
def three_torch_threads() -> Iterator[None]:
    """The test's process on 3 torch threads, given back after the test."""
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    yield
    torch.set_num_threads(before)


def test_a_worker_nodes_ranks_take_every_thread_unless_told_their_count(
    three_torch_threads: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A node of rank above 0 serves no HTTP: its ranks (which take the count the process
    has when it starts them) keep all 3 threads, or take the count `--engine-threads` gives."""
    counts = []

    def ranks_started(args: object, **options: object) -> int:
        counts.append(torch.get_num_threads())
        return 0

    monkeypatch.setattr(serve_command, "run_worker_node", ranks_started)
    node_1 = ["serve", "--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", "1",
              "--master-addr", "127.0.0.1", "--master-port", "1"]  # fmt: skip
    for flags in ([], ["--engine-threads", "1"]):
        assert serve_command.run_serve(build_parser().parse_args([*node_1, *flags])) == 0
    assert counts == [3, 1]
    said = capsys.readouterr().err.splitlines()
    assert said == [f"llmengine: this node's ranks run their forward on {n} torch thread(s)"
                    for n in (3, 1)]  # fmt: skip


def test_a_bad_option_is_refused_in_one_line_as_on_a_thread() -> None:
    # A swap space without preemption by swap: EngineConfig refuses it, in the child.
    command = [sys.executable, "-m", "llmengine", "serve", "--engine-process", "--port", "0"]
    command += ["--swap-blocks", "4"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert "llmengine serve: error: swap_blocks=4 needs preemption='swap'" in run.stderr
    assert "Traceback" not in run.stderr


def test_ctrl_c_drains_the_server_before_its_engine_process_stops() -> None:
    """Ctrl-C signals the terminal's whole process group, the engine's process too: a stream
    in flight still ends with its finish reason, and the server exits 0."""
    with serving(start_new_session=True) as server:  # a process group of its own
        with stream_under_way(server) as lines:
            os.killpg(server.pid, signal.SIGINT)
            payloads = sse_payloads(lines)
        assert payloads[-1]["choices"][0]["finish_reason"] == "length"
        assert server.wait(60) == 0


def test_an_add_whose_caller_leaves_before_the_answer_is_aborted_and_the_loop_goes_on() -> None:
    """A client gone while its add crosses the pipe: the answer finds a cancelled future, its
    requests are aborted in the child, and the next add is served as usual."""
    import asyncio
    from functools import partial

    from llmengine.cli import build_parser
    from llmengine.cli.serve import engine_for
    from llmengine.server.engine_process import EngineProcess

    args = build_parser().parse_args(["serve", "--num-blocks", "64", "--max-num-seqs", "2"])
    engine = EngineProcess(partial(engine_for, args), max_waiting=4)
    params = llmengine.SamplingParams(max_tokens=300, ignore_eos=True)

    async def scenario() -> tuple[dict, int]:
        left = asyncio.create_task(engine.add([[1, 2, 3]], [params]))
        await asyncio.sleep(0)  # the add is on its way
        left.cancel()
        with pytest.raises(asyncio.CancelledError):
            await left
        ids, events = await engine.add([[4, 5]], [llmengine.SamplingParams(max_tokens=3)])
        tokens = 0
        while True:
            event = await asyncio.wait_for(events.get(), 30)
            tokens += 1
            if event.finish_reason is not None:
                break
        for _ in range(300):  # the abort crosses the pipe after the answer does
            metrics = metric_samples((await engine.render_metrics()).decode())
            if metrics.get('llmengine_requests_finished_total{reason="abort"}'):
                break
            await asyncio.sleep(0.05)
        return metrics, tokens

    engine.start()
    try:
        metrics, tokens = asyncio.run(scenario())
        assert engine.running
    finally:
        engine.stop()
    assert tokens == 3
    assert metrics['llmengine_requests_finished_total{reason="abort"}'] == 1
    assert metrics["llmengine_requests_running"] == 0
