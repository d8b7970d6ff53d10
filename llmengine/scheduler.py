"""The continuous-batching scheduler: who runs in the next forward, and with which blocks.

It works on integers only (block ids, slot numbers, token counts) and returns a plain
decision, `SchedulerOutput`; the engine runs the forward and hands the sampled tokens back
through `update`. That split is what lets every policy below be tested without a model.

`schedule()` is grow, then admit:
- grow: running requests, oldest first, get the block their next position needs; when the
  pool is dry the youngest running request is preempted by recompute;
- admit: waiting requests in arrival order, while a slot is free and the pool holds what
  `blocks_needed_for` asks. The head of the queue blocks everyone behind it.

`update()` records the sampled tokens and releases at once every request that got its last
one: its blocks and slot are free before the step that produced that token returns.

Two policies share that loop. "reserve" (lesson 12) books prompt plus the whole budget at
admission, so growth never needs a block and nothing is ever preempted. "incremental"
(lesson 13) books only what the tokens so far need and buys a block when a sequence crosses
a block boundary, which is why it must be able to preempt.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from llmengine.blocks import BlockPool, blocks_for_length
from llmengine.request import Request, RequestState

POLICIES = ("incremental", "reserve")


@dataclass(slots=True)
class ScheduledRow:
    """One request's share of the next forward."""

    request: Request
    start_position: int
    num_positions: int
    is_prefill: bool
    recomputed: int

    @property
    def end_position(self) -> int:
        """One past the last position this forward computes: the K/V the row holds after it."""
        return self.start_position + self.num_positions

    @property
    def token_ids(self) -> list[int]:
        """The tokens whose positions this forward computes."""
        return self.request.token_ids[self.start_position : self.end_position]


@dataclass(slots=True)
class SchedulerOutput:
    """The decision for one iteration: rows to compute, and who was evicted to make room.

    `held_blocks` counts the pool's booked blocks once the decision is carried out: the pool
    the forward runs on, before `update` takes back what finished requests held.
    """

    rows: list[ScheduledRow] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    held_blocks: int = 0


class Scheduler:
    """Requests, a block pool and a fixed number of slots, under one admission policy."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_slots: int,
        policy: str = "incremental",
        watermark: int = 0,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if num_slots < 1:
            raise ValueError(f"num_slots must be at least 1, got {num_slots}")
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        if not 0 <= watermark < num_blocks:
            raise ValueError(f"watermark must be in [0, {num_blocks}), got {watermark}")
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.num_slots = num_slots
        self.policy = policy
        self.watermark = watermark
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.free_slots: deque[int] = deque(range(num_slots))
        # Called whenever a request gives back its blocks and slot (finish, abort, preempt),
        # at that moment, so the engine can reset what it keeps per slot before the slot is
        # handed to someone else inside the same schedule() call.
        self.on_release: Callable[[Request], None] | None = None

    # -- the one allocation rule -------------------------------------------------------

    def target_tokens(self, request: Request) -> int:
        """The positions a request's blocks must cover before its next forward."""
        if self.policy == "reserve":
            return request.worst_case_tokens
        return request.num_tokens

    def blocks_needed_for(self, request: Request) -> int:
        """Blocks a request must still acquire before its next forward.

        The same rule for every state: a fresh request needs its prompt's blocks, a running one
        0 or 1 (1 when it crosses a block boundary), a preempted one its prompt plus everything
        it generated, since its K/V went back with its blocks.
        """
        needed = blocks_for_length(self.target_tokens(request), self.block_size)
        return max(0, needed - len(request.block_table.block_ids))

    # -- requests in and out -----------------------------------------------------------

    def check_admissible(self, request: Request) -> None:
        """The door check: refuse at once a request whose worst case exceeds the empty pool.

        Admitting it would block the head of the queue forever, and under incremental
        allocation it is also what guarantees that a request which has evicted everyone
        else fits in the pool it is left alone with.
        """
        worst = blocks_for_length(request.worst_case_tokens, self.block_size)
        if worst > self.pool.num_blocks - self.watermark:
            raise ValueError(
                f"request needs up to {worst} blocks ({request.worst_case_tokens} tokens at "
                f"block size {self.block_size}) but the pool has {self.pool.num_blocks}"
                + (f" with {self.watermark} kept free" if self.watermark else "")
            )

    def add(self, request: Request) -> None:
        self.check_admissible(request)
        self.waiting.append(request)

    def abort(self, request: Request) -> None:
        """Abort a waiting, preempted or running request; its blocks and slot go back now."""
        if request.state == RequestState.WAITING:
            self.waiting.remove(request)
        elif request.state == RequestState.RUNNING:
            self.running.remove(request)
            self._release(request)
        request.move_to(RequestState.ABORTED)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one iteration -----------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        self._grow(out)
        self._admit(out)
        out.held_blocks = self.pool.num_held
        return out

    def _grow(self, out: SchedulerOutput) -> None:
        index = 0
        while index < len(self.running):
            request = self.running[index]
            needed = self.blocks_needed_for(request)
            while needed > self.pool.num_free:
                # Only requests not yet granted this step's block are candidates: evicting one
                # that already has its row would take back a block promised to the forward.
                victim = self.select_victim(self.running[index:])
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is request:
                    break
            if request.state is not RequestState.RUNNING:
                continue  # it was its own victim; the next request now sits at `index`
            request.block_table.extend(self.pool.allocate(needed))
            out.rows.append(self._decode_row(request))
            index += 1

    def _admit(self, out: SchedulerOutput) -> None:
        while self.waiting and self.free_slots:
            request = self.waiting[0]
            needed = self.blocks_needed_for(request)
            if self.pool.num_free - needed < self.watermark:
                break
            self.waiting.popleft()
            request.move_to(RequestState.RUNNING)
            request.slot = self.free_slots.popleft()
            request.block_table.extend(self.pool.allocate(needed))
            self.running.append(request)
            out.rows.append(self.prefill_row(request))

    def select_victim(self, candidates: list[Request]) -> Request:
        """Whom to preempt when growth finds the pool dry: the youngest candidate.

        `candidates` are the running requests, oldest first, from the one that needs a block
        to the youngest. Seniority is what makes growth terminate: the oldest running request
        is never a victim, so it always reaches its last token and frees its blocks. (Lesson
        16 swaps this rule for others and watches them fail.)
        """
        return candidates[-1]

    def prefill_row(self, request: Request) -> ScheduledRow:
        """The row that admits `request`: its prompt, or for a resumed request everything.

        A preempted request comes back over prompt plus the tokens it generated, all of them
        recomputed: resume, not restart, so it samples the token it would have sampled anyway.
        """
        resumed = request.num_preemptions > 0
        return ScheduledRow(
            request,
            start_position=0,
            num_positions=request.num_tokens,
            is_prefill=True,
            recomputed=request.num_tokens if resumed else 0,
        )

    @staticmethod
    def _decode_row(request: Request) -> ScheduledRow:
        return ScheduledRow(
            request,
            start_position=request.num_tokens - 1,
            num_positions=1,
            is_prefill=False,
            recomputed=0,
        )

    def _preempt(self, request: Request) -> None:
        """Preemption by recompute: blocks and slot back, tokens kept, head of the queue."""
        if self.policy == "reserve":
            raise AssertionError("the reserve policy never runs short, so never preempts")
        self.running.remove(request)
        self._release(request)
        request.move_to(RequestState.WAITING)
        request.num_preemptions += 1
        self.waiting.appendleft(request)

    def _release(self, request: Request) -> None:
        # The hook runs while the request still names its slot, so the engine knows which
        # row to reset before the slot can be handed to anyone else.
        if self.on_release is not None:
            self.on_release(request)
        self.pool.free(request.block_table.release())
        self.free_slots.append(request.slot)
        request.slot = None

    # -- after the forward -------------------------------------------------------------

    def update(
        self, out: SchedulerOutput, tokens: dict[int, int], eos_token_ids: tuple[int, ...] = ()
    ) -> list[Request]:
        """Record each row's sampled token; release and return the requests it finished.

        Rows follow the running list's order, so finished requests give their blocks back in
        the order the pool would have seen had they waited for the next `schedule()`.
        """
        finished = []
        for row in out.rows:
            request = row.request
            request.block_table.append(row.num_positions)
            reason = request.append_token(tokens[request.request_id], eos_token_ids)
            if reason is not None:
                request.finish_reason = reason
                request.move_to(RequestState.FINISHED)
                self.running.remove(request)
                self._release(request)
                finished.append(request)
        return finished

    # -- integrity ---------------------------------------------------------------------

    def check_integrity(self) -> None:
        """Free plus held equals the pool, no block held twice, every slot accounted for.

        Cheap enough to call after every step, which is what the tests do.
        """
        self.pool.check_integrity()
        held = [b for r in self.running for b in r.block_table.block_ids]
        if len(held) != len(set(held)):
            raise AssertionError("a block is held by two requests")
        if set(held) != self.pool.held_ids:
            raise AssertionError("the requests' block tables and the pool disagree")
        slots = [r.slot for r in self.running] + list(self.free_slots)
        if sorted(slots) != list(range(self.num_slots)):
            raise AssertionError(f"slots unaccounted for: running+free = {sorted(slots)}")
        for request in self.waiting:
            if request.block_table.block_ids or request.slot is not None:
                raise AssertionError(f"waiting request {request.request_id} holds resources")
        arrivals = [r.arrival for r in self.running]
        if arrivals != sorted(arrivals):
            raise AssertionError("running requests are not in seniority order")
