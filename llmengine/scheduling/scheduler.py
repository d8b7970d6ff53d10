"""The continuous-batching scheduler: who runs in the next forward, and with which blocks.

It works on integers only (block ids, slot numbers, token counts) and returns a plain
decision, `SchedulerOutput`; the engine runs the forward and hands the sampled tokens back
through `update`, which releases every request that got its last token. `schedule()` is:
- grow: running requests, oldest first, get the block their next position needs; when the
  pool is dry the youngest running request is preempted (`select_victim`). Each decoding one
  gets a decode row;
- swap in: swapped requests come back in the order they left, each as a decode row, while a
  slot is free and the pool holds their blocks with `free_blocks_to_keep` left free;
- continue prefills: the request part way through its prefill gets its next chunk;
- admit: waiting requests in arrival order, under the same rule, once nobody is left in swap,
  each with its first prefill chunk (`prefill_row`). The head of a queue blocks those behind.

Under a `max_num_batched_tokens` budget decode rows come first and always fit (the budget is
at least `num_slots`); prefill chunks share what is left, and one that stops short of its
request's last token samples nothing. A running request's drafted tokens (speculative
decoding) ride on its decode row and need blocks like any position; they are cut to what its
`max_tokens` and the budget leave (never below one decode position per slot). Each part it
leans on holds one idea: `EngineConfig`, `policy`, `BlockManager` (with or without prefix
caching) and `SwapSpace`; so does each part of the class itself: this module decides the
step, `preemption` evicts (by swap or recompute) and `step_bookkeeping` records what the step
did (`update`, `forward_failed`) and checks the invariants (`check_integrity`).
"""

from __future__ import annotations

from bisect import insort
from collections import deque
from typing import Any

from llmengine.engine_config import EngineConfig
from llmengine.kv.blocks import BlockPool, blocks_for_length
from llmengine.kv.prefix_cache import CachingBlockPool
from llmengine.scheduling.block_manager import BlockManager, CachingBlockManager
from llmengine.scheduling.decision import ScheduledRow, SchedulerOutput
from llmengine.scheduling.policy import ALLOCATION_POLICIES
from llmengine.scheduling.request import Request, RequestState
from llmengine.scheduling.step_bookkeeping import StepBookkeeping
from llmengine.scheduling.swap_space import SwapSpace


class Scheduler(StepBookkeeping):
    """Requests, a block pool and `num_slots` slots, under one `EngineConfig`.

    Built from a config, or from its fields as keywords (`Scheduler(num_blocks=8,
    block_size=4, num_slots=2)`). Three rules are methods a subclass may override to teach
    an alternative (`SchedulingRules`): `select_victim`, `prefill_row` and
    `free_blocks_to_keep`. Evicting is `Preemption`'s, what a step's tokens change
    `StepBookkeeping`'s (each in its own module).
    """

    def __init__(self, config: EngineConfig | None = None, /, **options: Any) -> None:
        self.config = EngineConfig.of(config, options)
        self.block_size = self.config.block_size
        self.num_slots = self.config.num_slots
        self.policy = ALLOCATION_POLICIES[self.config.policy]
        manager = CachingBlockManager if self.config.enable_prefix_caching else BlockManager
        self.blocks = manager(self.config.num_blocks, self.block_size)
        self.swap = SwapSpace(self.config.swap_blocks)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.free_slots: deque[int] = deque(range(self.num_slots))
        # Requests finished or aborted since the last decision, which the next one names, so
        # that whoever carries decisions out lets go of what it kept for them.
        self._done_since_last: list[int] = []

    @property
    def pool(self) -> BlockPool | CachingBlockPool:
        """The device block pool."""
        return self.blocks.pool

    @property
    def swapped(self) -> deque[Request]:
        """Requests whose K/V waits in host memory, in the order they left."""
        return self.swap.queue

    def blocks_needed_for(self, request: Request) -> int:
        """Device blocks a request must still acquire before its next forward.

        One rule for every state: a fresh request needs its prompt's blocks, a running one 0 or
        1 (1 when it crosses a block boundary), a preempted or swapped one its prompt plus
        everything it generated, since it holds no device block.
        """
        needed = blocks_for_length(self.policy.target_tokens(request), self.block_size)
        return max(0, needed - len(request.block_table.block_ids))

    # -- requests in and out -----------------------------------------------------------

    def check_door(self, request: Request) -> None:
        """The door: refuse at once a request whose worst case exceeds the empty pool.

        Admitting it would block the head of the queue forever, and under incremental
        allocation it is also what guarantees that a request which has preempted everyone
        else fits in the pool it is left alone with.
        """
        worst = blocks_for_length(request.worst_case_tokens, self.block_size)
        watermark = self.config.watermark
        if worst > self.blocks.num_blocks - watermark:
            raise ValueError(
                f"request needs up to {worst} blocks ({request.worst_case_tokens} tokens at "
                f"block size {self.block_size}) but the pool has {self.blocks.num_blocks}"
                + (f" with {watermark} kept free" if watermark else "")
            )

    def add(self, request: Request) -> None:
        self.check_door(request)
        self.waiting.append(request)

    def abort(self, request: Request) -> None:
        """Abort a waiting, preempted, swapped or running request; what it holds goes back now."""
        if request.state == RequestState.WAITING:
            self.waiting.remove(request)
        elif request.state == RequestState.RUNNING:
            self._release(request)
        elif request.state == RequestState.SWAPPED:
            self.swap.abort(request)
            request.block_table.release()
        request.move_to(RequestState.ABORTED)
        self._done_since_last.append(request.request_id)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    # -- one iteration -----------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(finished_request_ids=self._done_since_last)
        self._done_since_last = []
        self._grow(out)
        self._swap_in(out)
        self._continue_prefill(out)
        if not self.swapped:
            self._admit(out)
        out.held_blocks = self.blocks.num_held
        out.held_swap_blocks = self.swap.num_held
        return out

    def _grow(self, out: SchedulerOutput) -> None:
        granted = 0  # running[:granted] have their blocks for this step
        # Positions for drafts: under a budget, what is left once every slot has one position.
        spare = self._budget_for_drafts()
        while granted < len(self.running):
            request = self.running[granted]
            spare = request.trim_drafts(spare)
            needed = self.blocks_needed_for(request)
            # Only requests not yet granted are candidates: preempting one that has its row
            # would take back a block promised to this forward. The oldest is never a
            # candidate once granted, which is why growth always ends.
            while not self.blocks.can_allocate(needed):
                victim = self.select_victim(self.running[granted:])
                self._preempt(victim, out)
                out.preempted_for[victim.request_id] = request.request_id
                if victim is request:
                    break
            if request.state is not RequestState.RUNNING:
                continue  # it was its own victim; the next request now sits at `granted`
            self.blocks.allocate(request, needed)
            if not request.prefilling:  # a prefill's next chunk waits for the decodes
                self._add_row(ScheduledRow.decode(request), out)
            granted += 1

    def _budget_for_drafts(self) -> int | None:
        budget = self.config.max_num_batched_tokens
        return None if budget is None else budget - self.num_slots

    def _swap_in(self, out: SchedulerOutput) -> None:
        """Bring swapped requests back, first out first in, each as the decode row it left
        with; the block a boundary may need besides its K/V's is simply fresh. Before the
        unfinished prefill's chunk, which takes what the budget leaves: a decode always fits."""
        while self.swapped and self.free_slots:
            request = self.swapped[0]
            needed = self.blocks_needed_for(request)
            if self.blocks.num_free - needed < self.free_blocks_to_keep():
                break
            num_host = len(self.swap.host_blocks_of(request))
            device_ids = self.blocks.allocate(request, needed)
            out.blocks_to_swap_in.extend(self.swap.swap_in(request, device_ids[:num_host]))
            self._seat(request, RequestState.RUNNING)
            out.swapped_in.append(request)
            self._add_row(ScheduledRow.decode(request), out)

    def _continue_prefill(self, out: SchedulerOutput) -> None:
        """The running request part way through its prefill, if any, gets its next chunk.

        There is at most one: a chunk stops short only by spending the budget, and nobody is
        admitted once it is spent. And it always gets a chunk: the decodes take one position
        per other slot at most, and the budget is at least `num_slots`.
        """
        for request in self.running:
            if request.prefilling:
                self._add_row(self._prefill_chunk(request, out), out)

    def _admit(self, out: SchedulerOutput) -> None:
        while self.waiting and self.free_slots and self._budget_left(out) != 0:
            request = self.waiting[0]
            hits = self.blocks.cached_prefix(request)
            needed = self.blocks_needed_for(request) - len(hits)
            cost = self.blocks.admission_cost(hits, needed)
            if self.blocks.num_free - cost < self.free_blocks_to_keep():
                break
            self.waiting.popleft()
            self.blocks.admit(request, hits, needed)
            self._seat(request, RequestState.RUNNING)
            out.admitted.append(request)
            self._add_row(self._prefill_chunk(request, out), out)

    def _prefill_chunk(self, request: Request, out: SchedulerOutput) -> ScheduledRow:
        """`request`'s next prefill chunk within the budget; it stays `prefilling` unless the
        chunk samples (the flag follows the row, so `prefill_row` alone decides where a
        prefill ends)."""
        row = self.prefill_row(request, self._budget_left(out))
        request.prefilling = not row.samples
        return row

    def _add_row(self, row: ScheduledRow, out: SchedulerOutput) -> None:
        out.rows.append(row)
        # A draft's K/V is not the request's until the model keeps it: only offer blocks
        # the request's own tokens fill.
        out.cached_blocks += self.blocks.offer_full_blocks(
            row.request, row.end_position - len(row.draft_token_ids)
        )

    def _budget_left(self, out: SchedulerOutput) -> int | None:
        """Positions the rows decided so far leave of the step's budget; None: no budget."""
        if self.config.max_num_batched_tokens is None:
            return None
        return self.config.max_num_batched_tokens - sum(row.num_positions for row in out.rows)

    def _seat(self, request: Request, state: RequestState) -> None:
        """Give `request` a slot and its place among the running ones by seniority, which
        growth relies on: a swapped or preempted request may come back after a younger one."""
        request.move_to(state)
        request.slot = self.free_slots.popleft()
        insort(self.running, request, key=lambda running: running.arrival)
