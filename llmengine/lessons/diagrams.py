"""Pictures the lessons draw from the code itself rather than by hand.

`draw_state_machine` reads `TRANSITIONS`, so the diagram cannot disagree with the table the
engine enforces: add an edge to the table and it appears in every lesson that draws it.
Only where each state sits on the page is chosen here.
"""

from __future__ import annotations

from typing import Any

from llmengine.scheduling.request import TRANSITIONS, RequestState

# Where each state sits: the way through on the top row (waiting, running, finished), the
# swap space under running, and aborted under the live states that can be aborted, so that
# no two edges cross.
STATE_POSITIONS: dict[RequestState, tuple[float, float]] = {
    RequestState.WAITING: (0.0, 0.0),
    RequestState.RUNNING: (2.4, 0.0),
    RequestState.FINISHED: (4.8, 0.0),
    RequestState.SWAPPED: (3.6, -1.6),
    RequestState.ABORTED: (1.2, -1.6),
}


def _edge_curvature(source: RequestState, target: RequestState) -> float:
    """Bend the two edges of a pair (there and back) apart; every other edge is straight."""
    return 0.35 if TRANSITIONS[target].get(source) else 0.0


def draw_state_machine(
    ax: Any,
    *,
    highlight: tuple[str, ...] = ("preempt",),
    highlight_color: str = "#c0392b",
    title: str | None = None,
) -> None:
    """Draw every state and every legal move of `TRANSITIONS` on a matplotlib axis.

    Edges whose event is in `highlight` are drawn thick and in `highlight_color`.
    """
    for state, (x, y) in STATE_POSITIONS.items():
        terminal = not TRANSITIONS[state]
        ax.text(
            x,
            y,
            state.value,
            ha="center",
            va="center",
            fontsize=10,
            bbox={
                "boxstyle": "round,pad=0.5",
                "facecolor": "#eeeeee" if terminal else "#dbe9f6",
                "edgecolor": "#333333",
            },
            zorder=3,
        )
    for source, moves in TRANSITIONS.items():
        for target, event in moves.items():
            hot = event in highlight
            color = highlight_color if hot else "#333333"
            curvature = _edge_curvature(source, target)
            (x0, y0), (x1, y1) = STATE_POSITIONS[source], STATE_POSITIONS[target]
            ax.annotate(
                "",
                xy=(x1, y1),
                xytext=(x0, y0),
                arrowprops={
                    "arrowstyle": "-|>",
                    "color": color,
                    "lw": 2.4 if hot else 1.2,
                    "shrinkA": 24,
                    "shrinkB": 24,
                    "connectionstyle": f"arc3,rad={curvature}",
                },
                zorder=2,
            )
            # The label sits at the bulge of the arc: the chord's midpoint pushed sideways.
            mx, my = (x0 + x1) / 2, (y0 + y1) / 2
            dx, dy = x1 - x0, y1 - y0
            lx, ly = mx + curvature * dy / 2, my - curvature * dx / 2
            ax.text(
                lx,
                ly,
                event,
                ha="center",
                va="center",
                fontsize=8,
                color=color,
                fontweight="bold" if hot else "normal",
                bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none"},
                zorder=4,
            )
    # Equal aspect: arcs bend in screen space, so the labels only sit on them when a data
    # unit is as long across as it is up.
    ax.set_aspect("equal")
    ax.set_xlim(-0.7, 5.5)
    ax.set_ylim(-2.1, 0.7)
    ax.set_axis_off()
    if title:
        ax.set_title(title, fontsize=10)
