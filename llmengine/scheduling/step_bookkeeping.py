"""The scheduler's bookkeeping after a step: what the forward's tokens and faults change.

`update` records each row's sampled tokens (a draft's position counts only if the draft was
kept) and releases the requests they finish; `forward_failed` takes back what a forward that
raised, or ran without some rows, offered to the prefix cache and never filled;
`check_integrity` checks every invariant the scheduler keeps, cheaply enough for every step.
They sit apart from the decisions (`Scheduler.schedule`) because they read a decision after
the runner carried it out, never decide one; a finished request leaves the way an evicted
one does (`Preemption._release`), hence the base class.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from llmengine.scheduling.decision import SchedulerOutput, offered_blocks_of
from llmengine.scheduling.preemption import Preemption
from llmengine.scheduling.request import Request, RequestState


class StepBookkeeping(Preemption):
    """A carried-out decision's tokens and faults, and the integrity check; `Scheduler`
    holds the state named here."""

    block_size: int
    num_slots: int
    # Requests finished or aborted since the last decision (`Scheduler.schedule` names them).
    _done_since_last: list[int]

    def update(
        self,
        out: SchedulerOutput,
        tokens: Mapping[int, int | list[int]],
    ) -> list[Request]:
        """Record each row's sampled tokens; release and return the requests it finished.

        A row that `samples` gets its token from `tokens` (a list when speculation kept
        drafts: the kept drafts, then the model's own token), appended one by one until one
        finishes the request; a chunk that does not, or a row without a token (its sampling
        failed: the engine aborts it next), only advances its request's table. A draft's
        position counts as written only if the draft was kept: the next forward overwrites
        the others before anything reads them, and a block that only rejected drafts reached
        goes back to the pool. Finished requests give their blocks back in row order.
        """
        finished = []
        for row in out.rows:
            request = row.request
            new = tokens.get(request.request_id) if row.samples else None
            kept = [] if new is None else [new] if isinstance(new, int) else list(new)
            kept_drafts = max(len(kept) - 1, 0)
            request.block_table.append(row.num_positions - len(row.draft_token_ids) + kept_drafts)
            if row.draft_token_ids and not self.policy.books_ahead:
                self.blocks.trim(request)
            request.draft_token_ids.clear()
            for token in kept:
                reason = request.append_token(token)
                if reason is not None:
                    request.finish_reason = reason
                    request.move_to(RequestState.FINISHED)
                    self._release(request)
                    finished.append(request)
                    self._done_since_last.append(request.request_id)
                    break
        return finished

    def forward_failed(self, out: SchedulerOutput, left_out: Collection[int] | None = None) -> None:
        """The forward that carried `out` out raised (`left_out` None), or ran without the
        rows of the requests in `left_out` (their inputs could not be prepared): the blocks
        it offered to the prefix cache and never filled hold no K/V of theirs, and no later
        request may find them. Left-out rows leave `out`, so `update` moves none of their
        positions; the engine aborts their requests, which gives their blocks back."""
        if left_out is None:
            self.blocks.uncache(out.cached_blocks)
            return
        dropped = [row for row in out.rows if row.request.request_id in left_out]
        unwritten = [b for row in dropped for b in offered_blocks_of(out, row, self.block_size)]
        self.blocks.uncache(unwritten)
        out.rows = [row for row in out.rows if row.request.request_id not in left_out]
        out.cached_blocks = [block for block in out.cached_blocks if block not in unwritten]

    def check_integrity(self) -> None:
        """Free plus held equals each pool, no block held twice, every slot accounted for,
        one prefill in progress at most, seniority kept. Cheap enough for every step."""
        self.blocks.check_integrity(self.running)
        self.swap.check_integrity(self.block_size)
        slots = [r.slot for r in self.running] + list(self.free_slots)
        if sorted(slots) != list(range(self.num_slots)):
            raise AssertionError(f"slots unaccounted for: running+free = {sorted(slots)}")
        if sum(request.prefilling for request in self.running) > 1:
            raise AssertionError("more than one request part way through its prefill")
        for request in (*self.running, *self.waiting):
            request.check_integrity()
        arrivals = [r.arrival for r in self.running]
        if arrivals != sorted(arrivals):
            raise AssertionError("running requests are not in seniority order")
