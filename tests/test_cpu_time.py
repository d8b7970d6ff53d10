"""`llmengine.bench.cpu_time`: a process's CPU seconds from /proc, and the cores' idle share."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmengine.bench.cpu_time import idle_share, process_cpu_seconds

linux_proc = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")


@linux_proc
def test_a_sleeping_process_uses_almost_no_cpu_time() -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.5)  # past its start-up
        before = process_cpu_seconds(sleeper.pid)
        time.sleep(0.3)
        after = process_cpu_seconds(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait(timeout=10)
    assert before is not None and after is not None
    assert after - before < 0.1


@linux_proc
def test_this_process_counts_the_work_it_does() -> None:
    before = process_cpu_seconds(os.getpid())
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    after = process_cpu_seconds(os.getpid())
    assert before is not None and after is not None
    assert after - before >= 0.2


def test_a_process_that_is_gone_has_no_cpu_time() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=60)
    assert process_cpu_seconds(child.pid) is None


def test_the_idle_share_is_what_the_cores_did_not_use() -> None:
    assert idle_share(3.0, 2.0, 2) == pytest.approx(0.25)
    assert idle_share(4.0, 2.0, 2) == 0.0
    assert idle_share(5.0, 2.0, 2) == 0.0  # more than the cores (clock ticks): none idle


@linux_proc
def test_a_process_counts_the_work_of_the_processes_it_started() -> None:
    """A server whose engine runs in a child process: the child's CPU time is the server's."""
    busy_child = (
        "import time\n"
        "end = time.process_time() + 0.6\n"
        "while time.process_time() < end: pass\n"
        "time.sleep(60)"
    )
    starter = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {busy_child!r}])\n"
        "time.sleep(60)"
    )
    parent = subprocess.Popen([sys.executable, "-c", starter])
    try:
        time.sleep(3.0)  # both started, the child's busy part done
        total = process_cpu_seconds(parent.pid)
    finally:
        for child in Path(f"/proc/{parent.pid}/task").glob("*/children"):
            for pid in child.read_text().split():
                os.kill(int(pid), 9)
        parent.kill()
        parent.wait(timeout=10)
    assert total is not None
    assert total >= 0.5
