"""A real `llmengine serve` process for a lesson: started on a free local port, always stopped.

The lesson talks to the server the way a user would, over HTTP from another process, so the
client's timings never share an interpreter (or its lock) with the engine. The server
listens on 127.0.0.1 only. Start-up is bounded in time; on the way out the process gets
SIGTERM, the clean shutdown `llmengine serve` promises, and is killed if it does not exit.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from llmengine.bench.http_client import HOST, free_port, wait_for_health

START_TIMEOUT_S = 180.0  # loading and timing the kernels takes most of a minute on a busy machine
STOP_TIMEOUT_S = 15.0


@dataclass(frozen=True, slots=True)
class LiveServer:
    """A running server: `url` is its root, `api` the OpenAI API root (`url` + /v1)."""

    url: str
    command: tuple[str, ...]
    exit_code: list[int]  # filled in when the process has been stopped

    @property
    def api(self) -> str:
        return f"{self.url}/v1"


def read_metrics(url: str, *, timeout: float = 10.0) -> dict[str, float]:
    """Every sample of `{url}/metrics` by name; labels are folded in as `name{k="v"}`."""
    return metric_samples(httpx.get(f"{url}/metrics", timeout=timeout).text)


def metric_samples(text: str) -> dict[str, float]:
    """Every sample of a Prometheus text exposition by name, labels folded in as
    `name{k="v"}`."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return samples


@contextmanager
def live_server(options: Sequence[str] = ()) -> Iterator[LiveServer]:
    """Run `llmengine serve --host 127.0.0.1 --port <free> *options` for the `with` block."""
    port = free_port()
    command = (sys.executable, "-m", "llmengine", "serve", "--host", HOST, "--port", str(port))
    command += tuple(options)
    with tempfile.TemporaryFile(mode="w+") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        server = LiveServer(f"http://{HOST}:{port}", command, [])
        try:
            try:
                wait_for_health(server.url, process, START_TIMEOUT_S)
            except RuntimeError as error:
                log.seek(0)
                raise RuntimeError(
                    f"llmengine serve did not start ({error}):\n{log.read()[-2000:]}"
                ) from None
            yield server
        finally:
            process.terminate()
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_TIMEOUT_S)
            server.exit_code.append(process.returncode)
