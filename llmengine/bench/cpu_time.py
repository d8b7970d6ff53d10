"""CPU time a process has used, read from Linux's `/proc`: what a server spent on a burst.

A server that streams slower than its engine steps is bound either by its cores (every core
busy: the forward, the HTTP side and the client take turns) or by something that makes its
threads wait for each other (a lock): then cores sit idle during the burst. The CPU seconds
the server and its client used, set against the cores' seconds, tell the two apart.
"""

from __future__ import annotations

import os
from pathlib import Path


def process_cpu_seconds(pid: int) -> float | None:
    """Seconds process `pid` and the processes it started (an engine in a process of its own,
    tensor-parallel workers), still running, have run on a CPU: user and system, all their
    threads together. None where `/proc` cannot say (not Linux, or `pid` has gone)."""
    own = _own_cpu_seconds(pid)
    if own is None:
        return None
    return own + sum(_own_cpu_seconds(child) or 0.0 for child in _descendants(pid))


def _own_cpu_seconds(pid: int) -> float | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    # utime and stime are fields 14 and 15, in clock ticks.
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _descendants(pid: int) -> list[int]:
    """The processes `pid` started, and theirs, from each thread's `children` list."""
    found: list[int] = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            pids = [int(child) for child in children.read_text().split()]
        except OSError:
            continue
        for child in pids:
            found += [child, *_descendants(child)]
    return found


def idle_share(cpu_seconds: float, wall_seconds: float, cores: int) -> float:
    """The share of `cores` cores' time over `wall_seconds` that `cpu_seconds` left unused."""
    return max(0.0, 1.0 - cpu_seconds / (cores * wall_seconds))
