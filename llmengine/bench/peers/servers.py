"""A peer's server as a child process: started on a free local port, stopped by its pid.

Unlike `llmengine.lessons.live_server`, the command is anyone's (llama-server, `vllm serve`,
`llmengine serve`), start-up may take minutes (vLLM on a CPU), and the log goes to a file in
the cache so a failure can be read afterwards. Every wait is bounded.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

from llmengine.bench.http_client import HOST, free_port

STOP_TIMEOUT_S = 20.0


def _tail(path: Path, lines: int = 2) -> str:
    """The log's last non-empty lines: usually the error that stopped the server."""
    if not path.exists():
        return ""
    kept = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return " | ".join(kept[-lines:])


def wait_until_healthy(url: str, process: subprocess.Popen, timeout: float, log: Path) -> None:
    """Poll `{url}/health` every half second until it answers 200; RuntimeError otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"exited with status {process.returncode}: {_tail(log)}")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"no healthy answer in {timeout:g} s: {_tail(log)}")


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the server's pid, SIGKILL if it is still there after STOP_TIMEOUT_S."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_TIMEOUT_S)


@contextmanager
def running(
    command: Sequence[str], *, env: dict[str, str], log: Path, start_timeout: float
) -> Iterator[str]:
    """Run `command` with `{port}` replaced by a free port; yield its root URL, then stop it."""
    port = free_port()
    argv = [part.replace("{port}", str(port)) for part in command]
    url = f"http://{HOST}:{port}"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        print(f"  starting {' '.join(argv[:3])} ... on {url} (log: {log})", flush=True)
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            wait_until_healthy(url, process, start_timeout, log)
            yield url
        finally:
            stop(process)
