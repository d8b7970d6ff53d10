"""The scheduler's decision for one iteration, as plain data: rows to compute and block moves.

`Scheduler.schedule()` returns a `SchedulerOutput`; the engine carries it out (swap copies,
the forward, sampling) and hands the sampled tokens back through `Scheduler.update`. Nothing
here touches a tensor, which is what lets every scheduling rule be tested without a model.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from itertools import accumulate

from llmengine.scheduling.request import Request


@dataclass(slots=True)
class ScheduledRow:
    """One request's share of the next forward: positions [start, start + num_positions).

    A decode row is one position; a prefill row is a chunk of a (re)admitted request's
    positions, the whole of them without a budget. `samples` is False only for a chunk that
    stops short of the request's last token: the forward computes its K/V and nothing is
    sampled from it.

    `recomputed` counts the row's positions below `request.num_discarded_tokens`: K/V that
    existed once and an eviction by recompute threw away. By the seeds' rule a victim evicted
    while decoding counts all its tokens, the last sampled one too (lesson 14's count), so
    its resumed prefill is all recomputed; a victim evicted mid-prefill counts only the
    positions it had computed, and the highest count over its evictions is kept, since a
    position computed once and lost is recomputed however often it was lost.

    `cached` counts the positions before `start_position` that the prefix cache served: a
    (re)admitted request's first chunk starts where its cached blocks end.

    `draft_token_ids` are a decode row's guessed tokens, computed after its last token in the
    same forward (speculative decoding); none otherwise.
    """

    request: Request
    start_position: int
    num_positions: int
    is_prefill: bool
    recomputed: int
    samples: bool = True
    cached: int = 0
    draft_token_ids: list[int] = field(default_factory=list)

    @property
    def end_position(self) -> int:
        """One past the last position this forward computes: the K/V the row holds after it."""
        return self.start_position + self.num_positions

    @property
    def token_ids(self) -> list[int]:
        """The tokens whose positions this forward computes (drafts last)."""
        end = self.end_position - len(self.draft_token_ids)
        return self.request.token_ids[self.start_position : end] + self.draft_token_ids

    def drop_drafts(self) -> None:
        """Compute the row without its drafts (their proposal failed): its own token only."""
        self.num_positions -= len(self.draft_token_ids)
        self.draft_token_ids.clear()

    @classmethod
    def decode(cls, request: Request) -> ScheduledRow:
        """The request's last token, whose K/V the forward computes, then its drafts."""
        drafts = list(request.draft_token_ids)
        return cls(
            request, request.num_tokens - 1, 1 + len(drafts), is_prefill=False, recomputed=0,
            draft_token_ids=drafts,
        )  # fmt: skip

    @classmethod
    def prefill_chunk(cls, request: Request, max_positions: int | None = None) -> ScheduledRow:
        """The next chunk of `request`'s prefill: from its first position without K/V, at most
        `max_positions` of them (None: all the rest).

        A (re)admitted request starts over its prompt, or, resumed, over prompt plus the tokens
        it generated: resume, not restart, so it samples the token it would have sampled anyway.
        Its first chunk starts after the positions its cached prefix served. The chunk that
        reaches its last token samples; the others do not.
        """
        start = request.block_table.num_tokens
        end = request.num_tokens
        if max_positions is not None:
            end = min(end, start + max_positions)
        return cls(
            request,
            start_position=start,
            num_positions=end - start,
            is_prefill=True,
            recomputed=max(0, min(end, request.num_discarded_tokens) - start),
            samples=end == request.num_tokens,
            cached=0 if request.prefilling else start,
        )


@dataclass(slots=True)
class SchedulerOutput:
    """The decision for one iteration: rows to compute, and who was evicted to make room.

    `preempted` lists every victim of the step, by either mode, in the order they were picked
    (the outcome calls them `evicted`), and `preempted_for` names, for each victim's id, the
    request whose growth needed its blocks (the victim's own id when it was the youngest left
    and gave way itself); `swapped_out` the ones whose K/V went to the swap
    space (the rest were preempted by recompute), and `swapped_in` the swapped requests that
    came back, each as a decode row. The block moves are (from, to) pairs:
    `blocks_to_swap_out` device block -> host block, `blocks_to_swap_in` host block -> device
    block. The cache must copy every swap-out, then every swap-in, then run the forward: a
    device block a victim gave up may already belong to a row or to a swapped-in request in
    this same decision. (Host blocks freed by a swap-in are never handed to a swap-out of the
    same decision: growth, which preempts, runs before swap-in.)

    `admitted` lists the requests admitted from the waiting queue (fresh or resumed), each in
    the decision that gives it its first prefill chunk.

    `held_blocks` counts the pool's booked blocks once the decision is carried out: the pool
    the forward runs on, before `update` takes back what finished requests held.
    `held_swap_blocks` counts the swap space's booked blocks at the same moment.

    `finished_request_ids` names the requests that finished or were aborted since the last
    decision: whoever carries decisions out (the model runner) lets go of what it kept for
    them (generators, grammar matchers, a draft model's progress).

    `cached_blocks` are the blocks the decision offered to the prefix cache before the
    forward that fills them: should that forward fail, or run without the row that was to
    fill one, their keys are forgotten (`Scheduler.forward_failed`).
    """

    rows: list[ScheduledRow] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    preempted_for: dict[int, int] = field(default_factory=dict)
    swapped_out: list[Request] = field(default_factory=list)
    swapped_in: list[Request] = field(default_factory=list)
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)
    held_blocks: int = 0
    held_swap_blocks: int = 0
    finished_request_ids: list[int] = field(default_factory=list)
    cached_blocks: list[int] = field(default_factory=list)


def packed_starts(rows: list[ScheduledRow]) -> list[int]:
    """Where each row's tokens start in the forward's packed tokens, and one past the end
    (counted from the rows' positions: no row's tokens are copied)."""
    return list(accumulate((row.num_positions for row in rows), initial=0))


def offered_blocks_of(out: SchedulerOutput, row: ScheduledRow, block_size: int) -> list[int]:
    """The blocks `out` offered to the prefix cache that `row`'s positions fill: K/V only its
    forward writes."""
    first = row.start_position // block_size
    last = -(-row.end_position // block_size)
    offered = set(out.cached_blocks)
    return [block for block in row.request.block_table.block_ids[first:last] if block in offered]


def readers_of_left_out(
    out: SchedulerOutput, left_out: Collection[int], block_size: int
) -> dict[int, int]:
    """The rows that would read K/V a left-out row was to write: a row admitted later in the
    same decision that took, as a prefix-cache hit, a block the left-out row offered (each
    reader's request id, with the left-out request's). Readers are left out in turn, so one
    pass in row order finds every reader of a reader: a hit always follows its offer."""
    unwritten: dict[int, int] = {}  # block -> the request whose row was to fill it
    readers: dict[int, int] = {}
    for row in out.rows:
        request_id = row.request.request_id
        if request_id not in left_out:
            owners = [unwritten[b] for b in row.request.block_table.block_ids if b in unwritten]
            if not owners:
                continue
            readers[request_id] = owners[0]
        for block in offered_blocks_of(out, row, block_size):
            unwritten[block] = request_id
    return readers
