"""Diagrams drawn from the code: the state machine shows exactly the transition table."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from llmengine.lessons.diagrams import draw_state_machine  # noqa: E402
from llmengine.scheduling.request import TRANSITIONS  # noqa: E402


def test_state_machine_draws_every_state_and_every_move() -> None:
    fig, ax = plt.subplots()
    draw_state_machine(ax, highlight=("preempt",), highlight_color="#ff0000")
    labels = [text.get_text() for text in ax.texts if text.get_text()]
    arrows = [text for text in ax.texts if isinstance(text, matplotlib.text.Annotation)]
    events = [event for moves in TRANSITIONS.values() for event in moves.values()]
    states = [state.value for state in TRANSITIONS]
    assert sorted(labels) == sorted(events + states)
    assert len(arrows) == len(events)
    red = [t.get_text() for t in ax.texts if matplotlib.colors.to_hex(t.get_color()) == "#ff0000"]
    assert red == ["preempt"]
    plt.close(fig)
