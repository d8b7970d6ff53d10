"""A request and its lifecycle: the states it can be in and the only moves between them.

The transition table below is the single source of truth: `Request.move_to` consults it, the
lifecycle lesson draws the state machine from it, and an illegal move raises instead of
leaving a request in a state nobody planned for. This module knows no tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from llmengine.blocks import BlockTable
from llmengine.params import SamplingParams, finish_reason


class RequestState(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


# state -> {next state: the event that makes the move}. RUNNING -> WAITING is preemption by
# recompute: the request gives back its blocks and slot, keeps its tokens, and waits again.
TRANSITIONS: dict[RequestState, dict[RequestState, str]] = {
    RequestState.WAITING: {RequestState.RUNNING: "admit", RequestState.ABORTED: "abort"},
    RequestState.RUNNING: {
        RequestState.FINISHED: "finish",
        RequestState.WAITING: "preempt",
        RequestState.ABORTED: "abort",
    },
    RequestState.FINISHED: {},
    RequestState.ABORTED: {},
}


class IllegalTransition(ValueError):
    """A move the transition table does not allow."""


@dataclass(slots=True, eq=False)
class Request:
    """One prompt on its way through the engine.

    `arrival` is its seniority (lower is older): the scheduler grows the oldest first and
    preempts the youngest. `block_table` is the one record of the blocks it holds; the
    scheduler extends it and the cache reads it, so the two can never disagree.
    """

    request_id: int
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival: int
    block_size: int
    output_token_ids: list[int] = field(default_factory=list)
    state: RequestState = RequestState.WAITING
    block_table: BlockTable = field(init=False)
    slot: int | None = None
    num_preemptions: int = 0
    finish_reason: str | None = None

    def __post_init__(self) -> None:
        self.block_table = BlockTable(self.block_size)

    @property
    def token_ids(self) -> list[int]:
        """Prompt plus everything generated: what a resumed prefill runs over."""
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def worst_case_tokens(self) -> int:
        """Prompt plus the whole budget: what Week 8 reserved and the door check measures."""
        return len(self.prompt_token_ids) + self.params.max_tokens

    @property
    def is_live(self) -> bool:
        return self.state in (RequestState.WAITING, RequestState.RUNNING)

    def move_to(self, state: RequestState) -> None:
        if state not in TRANSITIONS[self.state]:
            raise IllegalTransition(
                f"request {self.request_id}: {self.state.value} -> {state.value} is not allowed"
            )
        self.state = state

    def append_token(self, token_id: int, eos_token_ids: tuple[int, ...] = ()) -> str | None:
        """Record a sampled token; return why the request is now done, or None."""
        self.output_token_ids.append(token_id)
        return finish_reason(self.params, len(self.output_token_ids), token_id, eos_token_ids)
