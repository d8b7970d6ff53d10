"""A request and its lifecycle: the states it can be in and the only moves between them.

The transition table below is the single source of truth: `Request.move_to` consults it, the
lifecycle lesson draws the state machine from it, and an illegal move raises instead of
leaving a request in a state nobody planned for. This module knows no tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from llmengine.kv.blocks import BlockTable
from llmengine.kv.prefix_cache import BlockKey
from llmengine.params import SamplingParams, finish_reason


class RequestState(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"
    ABORTED = "aborted"


# state -> {next state: the event that makes the move}. RUNNING -> WAITING is preemption by
# recompute: the request gives back its blocks and slot, keeps its tokens, and waits again.
# RUNNING -> SWAPPED is preemption by swap: its K/V is copied to host memory and its slot given
# back; SWAPPED -> RUNNING copies the K/V back and it decodes on from where it stopped.
TRANSITIONS: dict[RequestState, dict[RequestState, str]] = {
    RequestState.WAITING: {RequestState.RUNNING: "admit", RequestState.ABORTED: "abort"},
    RequestState.RUNNING: {
        RequestState.FINISHED: "finish",
        RequestState.WAITING: "preempt",
        RequestState.SWAPPED: "swap out",
        RequestState.ABORTED: "abort",
    },
    RequestState.SWAPPED: {RequestState.RUNNING: "swap in", RequestState.ABORTED: "abort"},
    RequestState.FINISHED: {},
    RequestState.ABORTED: {},
}


class IllegalTransition(ValueError):
    """A move the transition table does not allow."""


@dataclass(slots=True, eq=False, kw_only=True)
class Request:
    """One prompt on its way through the engine.

    `token_ids` is the one list of its tokens, prompt first and every sampled token appended
    to it: what a prefill (fresh or resumed) runs over and where a decode reads its last
    token, so no step has to join prompt and output. `prompt_token_ids` is the prompt as given.
    `arrival` is its seniority (lower is older): the scheduler grows the oldest first and
    preempts the youngest. `block_table` is the one record of the blocks it holds; the
    scheduler extends it and the cache reads it, so the two can never disagree. While the
    request is `SWAPPED` its table names no block but still counts its positions with K/V,
    which the swap space holds in host blocks.
    `num_preemptions` counts every eviction, by recompute or by swap; `num_swaps` the swaps.

    `prefilling` is True while a (re)admitted request still has prefill positions to schedule:
    they may be computed over several steps (chunked prefill), and the count of positions with
    K/V (`block_table.num_tokens`) cannot tell a prompt one short of done from a decode.
    `num_discarded_tokens` is the most positions an eviction by recompute ever threw away:
    what a resumed prefill counts as recomputed (see `ScheduledRow`).

    Under prefix caching, `block_keys` are the keys of its leading full blocks (they depend on
    its tokens only, so they outlive a preemption), and `num_registered_blocks` how many of
    the blocks its table holds now have been offered to the cache.

    `draft_token_ids` are tokens a speculative proposer guessed to follow, set before each
    step: the next decode row computes them with the last token, and `update` keeps those the
    model agrees with.

    `eos_token_ids` are the model's end tokens, given once when the request is made: the
    request's own stop rule (`finish_reason`) reads them, so nothing else carries them.
    """

    request_id: int
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival: int
    block_size: int
    state: RequestState = RequestState.WAITING
    token_ids: list[int] = field(init=False)
    block_table: BlockTable = field(init=False)
    slot: int | None = None
    num_preemptions: int = 0
    num_swaps: int = 0
    prefilling: bool = False
    num_discarded_tokens: int = 0
    block_keys: list[BlockKey] = field(default_factory=list)
    num_registered_blocks: int = 0
    finish_reason: str | None = None
    draft_token_ids: list[int] = field(default_factory=list)
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)
        self.block_table = BlockTable(self.block_size)

    @property
    def output_token_ids(self) -> list[int]:
        """The tokens generated so far (a copy: append through `append_token`)."""
        return self.token_ids[len(self.prompt_token_ids) :]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def worst_case_tokens(self) -> int:
        """Prompt plus the whole budget: what lesson 12's reserve policy books up front."""
        return len(self.prompt_token_ids) + self.params.max_tokens

    def move_to(self, state: RequestState) -> None:
        if state not in TRANSITIONS[self.state]:
            raise IllegalTransition(
                f"request {self.request_id}: {self.state.value} -> {state.value} is not allowed"
            )
        self.state = state

    def check_integrity(self) -> None:
        """It holds what its state allows: waiting, no block, slot or prefill in progress; part
        way through a prefill, fewer positions computed than it has, in blocks for them all."""
        table = self.block_table
        if self.state is RequestState.WAITING and (
            table.block_ids or self.slot is not None or self.prefilling
        ):
            raise AssertionError(f"waiting request {self.request_id} holds resources")
        if self.prefilling and not table.num_tokens < self.num_tokens <= table.capacity:
            raise AssertionError(
                f"request {self.request_id} mid-prefill has {table.num_tokens} positions "
                f"computed of {self.num_tokens} in blocks for {table.capacity}"
            )

    def discard_kv(self) -> None:
        """Preempted by recompute: record what is lost for the resumed prefill's `recomputed`
        (the positions with K/V of a prefill cut short, every token of a decoding request)."""
        lost = self.block_table.num_tokens if self.prefilling else self.num_tokens
        self.num_discarded_tokens = max(self.num_discarded_tokens, lost)
        self.prefilling = False

    def trim_drafts(self, spare: int | None) -> int | None:
        """Cut the drafts to what `max_tokens` leaves (the step keeps at most one token past
        them) and to `spare` positions of the step's budget (None: no budget); returns the
        spare left. A request part way through its prefill has none."""
        drafts = self.draft_token_ids
        if self.prefilling:
            drafts.clear()
        room = self.params.max_tokens - self.num_output_tokens - 1
        del drafts[max(0, room if spare is None else min(room, spare)) :]
        return None if spare is None else spare - len(drafts)

    def append_token(self, token_id: int) -> str | None:
        """Record a sampled token; return why the request is now done, or None."""
        self.token_ids.append(token_id)
        return self.finish_reason_after(self.num_output_tokens, token_id)

    def finish_reason_after(self, num_output_tokens: int, token_id: int) -> str | None:
        """Why the request would be done once `token_id` is its output token number
        `num_output_tokens` (counted from 1), or None."""
        return finish_reason(self.params, num_output_tokens, token_id, self.eos_token_ids)
