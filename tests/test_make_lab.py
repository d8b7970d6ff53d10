"""`make lab` starts Jupyter on the lessons, as root too: started on a free loopback port, a
lesson fetched through its API, then stopped by the test (its whole process group)."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from pathlib import Path

import httpx

from llmengine.bench.http_client import free_port

ROOT = Path(__file__).resolve().parent.parent
LESSON = "01-the-model-from-its-parts.ipynb"  # the lab is rooted in lessons/
START_TIMEOUT_S = 60


def test_make_lab_serves_the_lessons() -> None:
    port, token = free_port(), secrets.token_hex(16)
    options = f"--no-browser --ip=127.0.0.1 --port={port} --IdentityProvider.token={token}"
    lab = subprocess.Popen(
        # -o: take the virtual environment as it is; this test never rebuilds it.
        ["make", "--no-print-directory", "-o", ".venv/.installed", "lab", f"LAB_OPTIONS={options}"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # make and Jupyter in one group, stopped together below
    )
    try:
        url = f"http://127.0.0.1:{port}/api/contents/{LESSON}"
        deadline = time.monotonic() + START_TIMEOUT_S
        response = None
        for _ in range(600):
            assert lab.poll() is None, lab.communicate()[0]
            try:
                response = httpx.get(url, params={"token": token}, timeout=5)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "make lab did not start serving"
                time.sleep(0.1)
        assert response is not None and response.status_code == 200, response
        notebook = response.json()
        assert notebook["type"] == "notebook" and notebook["content"]["cells"]
        refused = httpx.get(url, timeout=5)  # without the token
        assert refused.status_code in (401, 403)
    finally:
        stop(lab)


def stop(lab: subprocess.Popen) -> None:
    """SIGTERM to the whole group (make and Jupyter), SIGKILL if it is still there after 20 s."""
    for sig, wait_s in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(lab.pid, sig)
        except ProcessLookupError:
            return  # the group is gone already
        try:
            lab.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
