"""Lesson 29's figures, drawn from a live server's feed (`llmengine.lessons.watching`).

The pool over time stacks each request's blocks (a colour per request, as the dashboard
draws them), the prefix-cached blocks nobody holds (grey) and the free ones (white) up to
the pool's size, with a red tick at every snapshot that carried a preemption. The cascade
gives each request a lane coloured by its state from snapshot to snapshot, a cross where it
was preempted and an arrow to the request its blocks went to. The rates panel shows what
the feed reports besides: tokens per second, the running mean TTFT and inter-token latency,
and a step's time split between the host and the forward.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from llmengine.lessons.watching import PoolOverTime, Preemption

if TYPE_CHECKING:
    from matplotlib.figure import Figure

CACHED_COLOR, FREE_COLOR, EVICTED_COLOR = "#bdbdbd", "#ffffff", "#c0392b"
STATE_COLORS = {
    "waiting": "#deebf7",
    "prefill": "#6a51a3",
    "decode": "#31a354",
    "preempted": "#fdae6b",
    "swapped": "#9ecae1",
}


def request_color(request_id: int) -> Any:
    """One colour per request, the same in every figure of the lesson: tab20's, less its two
    greys, which would read as cached blocks."""
    import matplotlib

    colors = [c for i, c in enumerate(matplotlib.colormaps["tab20"].colors) if i not in (14, 15)]
    return colors[request_id % len(colors)]


def draw_pool_over_time(pool: PoolOverTime, preempted: Sequence[Preemption]) -> Figure:
    """The pool's blocks at every snapshot, stacked: each request's, cached, free."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(11, 4.4))
    layers = [pool.held[request] for request in pool.held]
    colors = [request_color(request) for request in pool.held]
    ax.stackplot(
        pool.t, *layers, pool.cached, pool.free, step="post",
        colors=[*colors, CACHED_COLOR, FREE_COLOR], edgecolor="#555555", linewidth=0.2,
    )  # fmt: skip
    times = sorted({event.t for event in preempted})
    ax.plot(times, [pool.size + 0.6] * len(times), "|", color=EVICTED_COLOR, ms=10)
    ax.set(
        xlabel="seconds since the first snapshot",
        ylabel="blocks",
        ylim=(0, pool.size + 1.5),
        xlim=(pool.t[0], pool.t[-1]),
        title=f"the pool over time ({pool.size} blocks, {len(pool.t)} snapshots)",
    )
    ax.legend(
        handles=[
            Patch(color=request_color(0), label="held by a request (a colour each)"),
            Patch(facecolor=CACHED_COLOR, edgecolor="#555555", label="cached, nobody's"),
            Patch(facecolor=FREE_COLOR, edgecolor="#555555", label="free"),
            plt.Line2D([], [], marker="|", color=EVICTED_COLOR, ls="", ms=10,
                       label=f"a snapshot carrying preemptions ({len(times)})"),
        ],
        loc="lower right", fontsize=8, ncols=2, framealpha=0.9,
    )  # fmt: skip
    return fig


def draw_cascade(
    states: Mapping[int, Sequence[tuple[int, str]]],
    preempted: Sequence[Preemption],
    last_step: int,
) -> Figure:
    """A lane per request, coloured by its state at each snapshot (a state covers the steps
    since the previous snapshot); a cross at each preemption, an arrow to whom it served."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    requests = sorted(states)
    lane = {request: index for index, request in enumerate(requests)}
    fig, ax = plt.subplots(figsize=(11, 0.3 * len(requests) + 2.2))
    for request in requests:
        previous = None
        for step, state in states[request]:
            start = step - 1 if previous is None else previous
            ax.broken_barh(
                [(start, step - start)], (lane[request] - 0.35, 0.7), color=STATE_COLORS[state]
            )
            previous = step
    for event in preempted:
        y = lane.get(event.victim)
        if y is None:
            continue
        ax.plot(event.step, y, marker="X", color=EVICTED_COLOR, ms=8, ls="")
        if event.made_room_for != event.victim and event.made_room_for in lane:
            ax.annotate(
                "", xy=(event.step, lane[event.made_room_for]), xytext=(event.step, y),
                arrowprops={"arrowstyle": "->", "color": EVICTED_COLOR, "lw": 0.8},
            )  # fmt: skip
    ax.set(
        yticks=range(len(requests)),
        yticklabels=[f"r{request}" for request in requests],
        ylim=(len(requests) - 0.4, -1.6),
        xlim=(0, last_step + 1),
        xlabel="engine step",
        title=f"the eviction cascade ({len(preempted)} preemptions)",
    )
    ax.legend(
        handles=[
            *(Patch(color=color, label=state) for state, color in STATE_COLORS.items()),
            plt.Line2D([], [], marker="X", color=EVICTED_COLOR, ls="", label="preempted, → for"),
        ],
        loc="upper right", ncols=6, fontsize=8,
    )  # fmt: skip
    return fig


def draw_rates(snapshots: Sequence[Mapping[str, Any]]) -> Figure:
    """Tokens per second; mean TTFT and ITL over the feed's window; a step's host/forward ms."""
    import matplotlib.pyplot as plt

    t = [snapshot["t"] - snapshots[0]["t"] for snapshot in snapshots]
    rates = [snapshot["rates"] for snapshot in snapshots]
    nan = float("nan")
    fig, (ax_tokens, ax_latency, ax_step) = plt.subplots(1, 3, figsize=(13, 3.8), sharex=True)
    ax_tokens.step(t, [rate["tokens_per_s"] for rate in rates], where="post", color="#31a354")
    ax_tokens.set(xlabel="seconds", ylabel="tokens/s", title="tokens per second")
    for key, label, color in (("ttft_ms", "TTFT", "#e6550d"), ("itl_ms", "ITL", "#2c7fb8")):
        values = [nan if rate[key] is None else rate[key] for rate in rates]
        ax_latency.plot(t, values, color=color, label=f"mean {label}")
    ax_latency.set(xlabel="seconds", ylabel="ms", yscale="log", title="latency, running mean")
    ax_latency.legend(fontsize=8)
    host = [snapshot["step_ms"][0] for snapshot in snapshots]
    forward = [snapshot["step_ms"][1] for snapshot in snapshots]
    ax_step.stackplot(t, forward, host, step="post", colors=["#756bb1", "#fdae6b"],
                      labels=["forward", "host"])  # fmt: skip
    ax_step.set(xlabel="seconds", ylabel="ms per step", title="a step's time")
    ax_step.legend(fontsize=8, loc="upper right")
    return fig
