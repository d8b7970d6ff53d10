"""Preemption: how the scheduler takes a running request's place back when the pool runs dry.

Growth (`Scheduler.schedule`) picks the victim (`SchedulingRules.select_victim`); this part
carries the eviction out. A victim goes to host memory when the swap space holds its blocks
(`SwapSpace`: its K/V kept, it comes back as a decode row), else it is recomputed (its K/V
thrown away, its tokens kept, back at the head of the waiting queue). Either way its slot
and device blocks go back at once, the way a finished or aborted request's do (`_release`),
which is why the step's bookkeeping builds on this class. It lives apart from the decisions
because it is one idea with its own invariants: every eviction counts in `num_preemptions`,
drops the victim's drafts and keeps every token it had.
"""

from __future__ import annotations

from collections import deque

from llmengine.scheduling.block_manager import BlockManager
from llmengine.scheduling.decision import SchedulerOutput
from llmengine.scheduling.policy import AllocationPolicy
from llmengine.scheduling.request import Request, RequestState
from llmengine.scheduling.rules import SchedulingRules
from llmengine.scheduling.swap_space import SwapSpace


class Preemption(SchedulingRules):
    """Evicting a running request by swap or by recompute, and giving a leaving request's
    slot and blocks back; `Scheduler` holds the state named here."""

    policy: AllocationPolicy
    blocks: BlockManager
    swap: SwapSpace
    waiting: deque[Request]
    running: list[Request]
    free_slots: deque[int]

    def _preempt(self, victim: Request, out: SchedulerOutput) -> None:
        """Preempt by swap when the swap space holds the victim's blocks, else by recompute.

        A victim part way through its prefill is always recomputed: a swapped request comes
        back as a decode row, which needs K/V for all its positions but the last.
        """
        if not self.policy.preempts:
            raise AssertionError("the reserve policy never runs short, so never preempts")
        out.preempted.append(victim)
        victim.draft_token_ids.clear()
        num_blocks = len(victim.block_table.block_ids)
        if not victim.prefilling and self.swap.can_hold(num_blocks):
            out.blocks_to_swap_out.extend(self._swap_out(victim))
            out.swapped_out.append(victim)
        else:
            self._preempt_by_recompute(victim)
        victim.num_preemptions += 1

    def _preempt_by_recompute(self, request: Request) -> None:
        """K/V thrown away, blocks and slot back, tokens kept, head of the waiting queue."""
        request.discard_kv()
        self._release(request)
        request.move_to(RequestState.WAITING)
        self.waiting.appendleft(request)

    def _swap_out(self, request: Request) -> list[tuple[int, int]]:
        """K/V to host blocks, slot back, tokens kept, tail of the swap queue; returns the
        (device block, host block) copies to make before the forward."""
        self.running.remove(request)
        self._free_slot(request)
        copies = self.swap.swap_out(request, self.blocks.detach(request))
        request.move_to(RequestState.SWAPPED)
        request.num_swaps += 1
        return copies

    def _release(self, request: Request) -> None:
        """A running request leaves: its blocks and its slot go back."""
        self.running.remove(request)
        self._free_slot(request)
        self.blocks.free(request)

    def _free_slot(self, request: Request) -> None:
        self.free_slots.append(request.slot)
        request.slot = None
