"""Lesson 13's figure: blocks bought a step at a time, and the evictions that pays for.

Left, one request's blocks per forward under both allocation rules, against the K/V it has
written (`blocks_held_per_forward` drives the scheduler alone, no model, so it reads what the
request holds *during* each forward). Right, a cramped run request by request: the forwards
each request is in, the resumed prefills marked apart, and a cross where it was evicted.
Each policy keeps lesson 12's colour.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from llmengine.bench.batchbench import PoolResult
from llmengine.lessons.artifacts import use_lesson_style
from llmengine.lessons.reservation_figure import POLICY_COLORS
from llmengine.sampling import SamplingParams
from llmengine.scheduling.request import Request
from llmengine.scheduling.scheduler import Scheduler

RESUMED_COLOR, EVICTED_COLOR = "tab:purple", "#c0392b"


def blocks_held_per_forward(
    policy: str, prompt_tokens: int, max_tokens: int, block_size: int, num_blocks: int = 64
) -> list[int]:
    """The blocks one lone request holds in each of its forwards, from its prefill to the
    forward that samples its last token, under `policy` (no early stop)."""
    scheduler = Scheduler(num_blocks=num_blocks, block_size=block_size, num_slots=1, policy=policy)
    request = Request(
        request_id=0,
        prompt_token_ids=[1] * prompt_tokens,
        params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        arrival=0,
        block_size=block_size,
    )
    scheduler.add(request)
    held = []
    while scheduler.has_unfinished():
        decision = scheduler.schedule()
        held.append(len(request.block_table.block_ids))
        scheduler.update(decision, {0: 7})
    return held


def draw_incremental_allocation(
    held: Mapping[str, Sequence[int]],
    prompt_tokens: int,
    block_size: int,
    cramped: PoolResult,
) -> Figure:
    """Left, `held` (blocks per forward, per policy) for one request with `prompt_tokens`;
    right, every request of `cramped`, a run under incremental allocation that evicts."""
    use_lesson_style()
    fig, (ax_blocks, ax_cascade) = plt.subplots(
        1, 2, figsize=(11, 4.4), gridspec_kw={"width_ratios": [1.0, 1.3]}
    )
    for policy, blocks in held.items():
        ax_blocks.step(
            range(1, len(blocks) + 1),
            blocks,
            where="post",
            color=POLICY_COLORS[policy],
            lw=2,
            label=f"held ({policy})",
        )
    forwards = range(1, max(len(blocks) for blocks in held.values()) + 1)
    ax_blocks.plot(
        forwards,
        [(prompt_tokens + forward - 1) / block_size for forward in forwards],
        ls=":",
        color="#333333",
        label="K/V written / block size",
    )
    top = max(max(blocks) for blocks in held.values())
    ax_blocks.set(
        xlabel="iteration", ylabel="blocks", title="one request's blocks", ylim=(0, top + 1)
    )
    ax_blocks.legend(loc="lower right", fontsize=8)

    request_ids = cramped.run.request_ids
    outcomes = cramped.run.outcomes
    for lane, request_id in enumerate(request_ids):
        for number, outcome in enumerate(outcomes, start=1):
            if request_id in outcome.tokens:
                resumed = request_id in outcome.resumed
                ax_cascade.broken_barh(
                    [(number - 0.5, 1)],
                    (lane - 0.35, 0.7),
                    color=RESUMED_COLOR if resumed else POLICY_COLORS["incremental"],
                )
            if request_id in outcome.evicted:
                ax_cascade.plot(number, lane, marker="X", color=EVICTED_COLOR, ms=10, ls="")
    ax_cascade.set(
        yticks=range(len(request_ids)),
        yticklabels=[f"r{lane}" for lane in range(len(request_ids))],
        xlabel="iteration",
        xlim=(0, len(outcomes) + 1),
        ylim=(len(request_ids) - 0.4, -1.4),
        title=f"the eviction cascade ({cramped.pool_blocks * block_size}-token pool, incremental)",
    )
    ax_cascade.legend(
        handles=[
            Patch(color=POLICY_COLORS["incremental"], label="in the forward"),
            Patch(color=RESUMED_COLOR, label="resumed prefill"),
            Line2D([], [], marker="X", color=EVICTED_COLOR, ls="", label="evicted"),
        ],
        loc="upper right",
        ncols=3,
        fontsize=8,
    )
    fig.suptitle(
        "Incremental allocation: the same tokens, no reservation waste, some K/V computed twice"
    )
    return fig
