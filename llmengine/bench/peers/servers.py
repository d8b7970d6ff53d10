"""A peer's server as a child process: started on a free local port, stopped by its pid.

Unlike `llmengine.lessons.live_server`, the command is anyone's (llama-server, `vllm serve`,
`llmengine serve`), start-up may take minutes (vLLM on a CPU), and the log goes to a file in
the cache so a failure can be read afterwards. Every wait is bounded.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from llmengine.bench.http_client import HOST, free_port, wait_for_health

STOP_TIMEOUT_S = 20.0


def _tail(path: Path, lines: int = 2) -> str:
    """The log's last non-empty lines: usually the error that stopped the server."""
    if not path.exists():
        return ""
    kept = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return " | ".join(kept[-lines:])


def wait_until_healthy(url: str, process: subprocess.Popen, timeout: float, log: Path) -> None:
    """`http_client.wait_until_healthy`, with the end of the server's log in its error."""
    try:
        wait_for_health(url, process, timeout)
    except RuntimeError as error:
        raise RuntimeError(f"{error}: {_tail(log)}") from None


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
    with started(command, env=env, log=log, start_timeout=start_timeout) as (url, _):
        yield url


@contextmanager
def started(
    command: Sequence[str], *, env: dict[str, str], log: Path, start_timeout: float
) -> Iterator[tuple[str, subprocess.Popen]]:
    """`running`, yielding the server's process beside its URL (to read its CPU time)."""
    port = free_port()
    argv = [part.replace("{port}", str(port)) for part in command]
    url = f"http://{HOST}:{port}"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        print(f"  starting {' '.join(argv[:3])} ... on {url} (log: {log})", flush=True)
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            wait_until_healthy(url, process, start_timeout, log)
            yield url, process
        finally:
            stop(process)
