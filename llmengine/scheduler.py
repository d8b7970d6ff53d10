"""The continuous-batching scheduler: who runs in the next forward, and with which blocks.

It works on integers only (block ids, slot numbers, token counts) and returns a plain
decision, `SchedulerOutput`; the engine runs the forward and hands the sampled tokens back
through `update`. That split is what lets every policy below be tested without a model.

`schedule()` is grow, swap in, continue prefills, then admit:
- grow: running requests, oldest first, get the block their next position needs; when the
  pool is dry the youngest running request is preempted. Each decoding one gets its row;
- swap in: swapped requests come back in the order they left, while a slot is free and the
  pool holds their blocks with the watermark kept free (the admission rule);
- continue prefills: the running request whose prefill is unfinished, if any, gets its next
  chunk, as much of it as the step's budget of positions leaves;
- admit: waiting requests in arrival order, under the same rule, once nobody is left in swap,
  while the budget lasts. The head of either queue blocks everyone behind it.

`max_num_batched_tokens` (chunked prefill) caps the positions one forward computes.
Decode rows come first and always fit (the cap is at least `num_slots`, as vLLM requires);
prefill chunks share what is left, in queue order, so a long prompt is prefilled over several
steps while the others keep decoding. Only the computation is chunked: a request is admitted
with the blocks for its whole prompt (or, under "reserve", its worst case), exactly as
without a cap, and holds its slot and blocks between chunks. At most one request is part way
through its prefill at any time, and it gets a chunk every step (`_continue_prefills`).
With no cap (None) every prefill is one chunk.

`update()` records the sampled tokens and releases at once every request that got its last
one: its blocks and slot are free before the step that produced that token returns. A row
that only computes part of a prefill samples nothing: its request's table advances, and its
sampler (a seeded generator) is not touched until the row that reaches its last position, so
the text does not depend on the cap.

Two policies share that loop. "reserve" (lesson 12) books prompt plus the whole budget at
admission, so growth never needs a block and nothing is ever preempted. "incremental"
(lesson 13) books only what the tokens so far need and buys a block when a sequence crosses
a block boundary, which is why it must be able to preempt.

Two preemption modes share the victim rule. "recompute" (lesson 13) gives the victim's blocks
back and recomputes its K/V in a prefill when it resumes. "swap" (lesson 18) moves its K/V to
a host swap space of `swap_blocks` blocks, a second `BlockPool`, and back when it resumes, so
it recomputes nothing; a victim the swap space cannot hold is preempted by recompute instead.
The scheduler only says which block goes where (`blocks_to_swap_out`, `blocks_to_swap_in`);
the engine does the copying. A victim whose prefill is unfinished is always preempted by
recompute: a swapped request comes back as a decode row, which needs all its K/V but the last
sampled token's, and a partial prefill has neither.

`enable_prefix_caching` (lesson 21) puts a `CachingBlockPool` under the same loop. Full blocks
are named by their tokens and their parent block's key and offered to the cache as the rows
that fill them are decided; a (re)admitted request takes its leading cached blocks instead of
computing them, except the one holding its last token, which its prefill must compute. Blocks
are reference-counted, so a shared block is held once per table naming it, and a block nobody
holds stays cached, and free for admission, until the pool evicts it.
"""

from __future__ import annotations

from bisect import insort
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from llmengine.blocks import BlockPool, blocks_for_length
from llmengine.prefix_cache import BlockKey, CachingBlockPool, block_hash
from llmengine.request import Request, RequestState

# The first of each is the default (`Scheduler`, `Engine` and the command line).
POLICIES = ("incremental", "reserve")
PREEMPTION_MODES = ("recompute", "swap")


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
    """

    request: Request
    start_position: int
    num_positions: int
    is_prefill: bool
    recomputed: int
    samples: bool = True
    cached: int = 0

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

    `preempted` lists every victim of the step in the order they were picked; `swapped_out`
    the ones whose K/V went to the swap space (the rest were preempted by recompute), and
    `swapped_in` the swapped requests that came back, each as a decode row. The block moves
    are (from, to) pairs: `blocks_to_swap_out` device block -> host block, `blocks_to_swap_in`
    host block -> device block. The engine must copy every swap-out, then every swap-in, then
    run the forward: a device block a victim gave up may already belong to a row or to a
    swapped-in request in this same decision. (Host blocks freed by a swap-in are never handed
    to a swap-out of the same decision: growth, which evicts, runs before swap-in.)

    `admitted` lists the requests admitted from the waiting queue (fresh or resumed), each in
    the decision that gives it its first prefill chunk.

    `held_blocks` counts the pool's booked blocks once the decision is carried out: the pool
    the forward runs on, before `update` takes back what finished requests held.
    `held_swap_blocks` counts the swap space's booked blocks at the same moment.
    """

    rows: list[ScheduledRow] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    swapped_out: list[Request] = field(default_factory=list)
    swapped_in: list[Request] = field(default_factory=list)
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)
    held_blocks: int = 0
    held_swap_blocks: int = 0


class Scheduler:
    """Requests, a block pool and a fixed number of slots, under one admission policy.

    `preemption` is what an eviction does ("recompute" or "swap"); `swap_blocks` sizes the
    host swap space and must be 0 under "recompute", which never uses one. "swap" with no
    swap blocks is allowed and behaves exactly as "recompute" (every victim finds the swap
    space full), so a sweep over swap sizes may start at 0.

    `max_num_batched_tokens` caps the positions of one forward (None: no cap); it must be at
    least `num_slots`, so that every running request's decode fits in a step and an
    unfinished prefill always gets a chunk: nobody starves.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_slots: int,
        policy: str = "incremental",
        watermark: int = 0,
        *,
        preemption: str = "recompute",
        swap_blocks: int = 0,
        max_num_batched_tokens: int | None = None,
        enable_prefix_caching: bool = False,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if preemption not in PREEMPTION_MODES:
            raise ValueError(f"preemption must be one of {PREEMPTION_MODES}, got {preemption!r}")
        if not isinstance(swap_blocks, int) or isinstance(swap_blocks, bool) or swap_blocks < 0:
            raise ValueError(f"swap_blocks must be a whole number >= 0, got {swap_blocks!r}")
        if preemption == "recompute" and swap_blocks:
            raise ValueError(
                f"swap_blocks={swap_blocks} needs preemption='swap': preemption by recompute "
                "never uses a swap space"
            )
        if num_slots < 1:
            raise ValueError(f"num_slots must be at least 1, got {num_slots}")
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        if max_num_batched_tokens is not None and (
            not isinstance(max_num_batched_tokens, int)
            or isinstance(max_num_batched_tokens, bool)
            or max_num_batched_tokens < num_slots
        ):
            raise ValueError(
                f"max_num_batched_tokens must be None or a whole number >= num_slots "
                f"({num_slots}), so every running request's decode fits in one step; "
                f"got {max_num_batched_tokens!r}"
            )
        if not 0 <= watermark < num_blocks:
            raise ValueError(f"watermark must be in [0, {num_blocks}), got {watermark}")
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self.pool = CachingBlockPool(num_blocks) if enable_prefix_caching else BlockPool(num_blocks)
        # Host block ids: integers like the device pool's, naming rows of the engine's host
        # swap tensors. None when there is no swap space at all.
        self.swap_pool = BlockPool(swap_blocks) if swap_blocks else None
        self.block_size = block_size
        self.num_slots = num_slots
        self.policy = policy
        self.preemption = preemption
        self.watermark = watermark
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        self.free_slots: deque[int] = deque(range(num_slots))
        # Called whenever a request gives back its slot (finish, abort, preempt, swap out), at
        # that moment, so the engine can reset what it keeps per slot before the slot is
        # handed to someone else inside the same schedule() call.
        self.on_release: Callable[[Request], None] | None = None

    @property
    def num_swap_blocks(self) -> int:
        return self.swap_pool.num_blocks if self.swap_pool else 0

    @property
    def num_free_swap_blocks(self) -> int:
        return self.swap_pool.num_free if self.swap_pool else 0

    # -- the one allocation rule -------------------------------------------------------

    def target_tokens(self, request: Request) -> int:
        """The positions a request's blocks must cover before its next forward."""
        if self.policy == "reserve":
            return request.worst_case_tokens
        return request.num_tokens

    def blocks_needed_for(self, request: Request) -> int:
        """Device blocks a request must still acquire before its next forward.

        The same rule for every state: a fresh request needs its prompt's blocks, a running one
        0 or 1 (1 when it crosses a block boundary), a preempted one its prompt plus everything
        it generated, since its K/V went back with its blocks. A swapped one needs as many as a
        preempted one: its table names host blocks, so it holds none on the device.
        """
        needed = blocks_for_length(self.target_tokens(request), self.block_size)
        if request.state is RequestState.SWAPPED:
            return needed
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
        """Abort a waiting, preempted, swapped or running request; what it holds goes back now."""
        if request.state == RequestState.WAITING:
            self.waiting.remove(request)
        elif request.state == RequestState.RUNNING:
            self.running.remove(request)
            self._release(request)
        elif request.state == RequestState.SWAPPED:
            self.swapped.remove(request)
            self.swap_pool.free(request.block_table.release())
        request.move_to(RequestState.ABORTED)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    # -- one iteration -----------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        self._grow(out)
        self._swap_in(out)
        self._continue_prefills(out)
        if not self.swapped:
            self._admit(out)
        out.held_blocks = self.pool.num_held
        out.held_swap_blocks = self.swap_pool.num_held if self.swap_pool else 0
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
                self._evict(victim, out)
                if victim is request:
                    break
            if request.state is not RequestState.RUNNING:
                continue  # it was its own victim; the next request now sits at `index`
            request.block_table.extend(self.pool.allocate(needed))
            if not request.prefilling:  # a prefill's next chunk waits for the decodes
                out.rows.append(self._decode_row(request))
                self._cache_full_blocks(request, request.num_tokens)
            index += 1

    def _swap_in(self, out: SchedulerOutput) -> None:
        """Bring swapped requests back, first out first in, each as a decode row.

        Its K/V comes back whole, so it decodes the token it sampled before it left, exactly
        the row it would have had; the one extra block a boundary may need is simply fresh.
        It goes before the unfinished prefill's chunk, which takes what the budget leaves: a
        decode row always fits, a row after a chunk that spent the budget would not.
        """
        while self.swapped and self.free_slots:
            request = self.swapped[0]
            needed = self.blocks_needed_for(request)
            if self.pool.num_free - needed < self.free_blocks_to_keep():
                break
            self.swapped.popleft()
            kept = len(request.block_table.block_ids)
            device_ids = self.pool.allocate(needed)
            host_ids = request.block_table.relocate(device_ids[:kept])
            request.block_table.extend(device_ids[kept:])
            self.swap_pool.free(host_ids)
            out.blocks_to_swap_in.extend(zip(host_ids, device_ids[:kept], strict=True))
            request.move_to(RequestState.RUNNING)
            request.slot = self.free_slots.popleft()
            self._seat(request)
            out.swapped_in.append(request)
            out.rows.append(self._decode_row(request))
            self._cache_full_blocks(request, request.num_tokens)

    def _continue_prefills(self, out: SchedulerOutput) -> None:
        """The running request part way through its prefill, if any, gets its next chunk.

        Its blocks were bought at admission, so growth gave it none. There is at most one: a
        chunk stops short only by spending the budget, and nobody is admitted once it is
        spent, so a second prefill can only start after the first one's last chunk. And it
        always gets a chunk: the decodes take one position per other slot at most, and the
        budget is at least `num_slots`. (`check_integrity` holds the scheduler to both.)
        """
        for request in self.running:
            if request.prefilling:
                self._schedule_prefill(request, out)

    def _admit(self, out: SchedulerOutput) -> None:
        while self.waiting and self.free_slots:
            budget = self._budget_left(out)
            if budget == 0:
                break  # admitting a request with no row would only hold its blocks idle
            request = self.waiting[0]
            hits = self._cached_prefix(request)
            needed = self.blocks_needed_for(request) - len(hits)
            # A hit is held, not bought; but an evictable one counted as free until taken.
            evictable = sum(self.pool.refcount(block) == 0 for block in hits)
            if self.pool.num_free - evictable - needed < self.free_blocks_to_keep():
                break
            self.waiting.popleft()
            request.move_to(RequestState.RUNNING)
            request.slot = self.free_slots.popleft()
            if hits:
                self.pool.take(hits)
                request.block_table.extend(hits)
                request.block_table.append(len(hits) * self.block_size)
            request.block_table.extend(self.pool.allocate(needed))
            self._seat(request)
            out.admitted.append(request)
            self._schedule_prefill(request, out)
            out.rows[-1].cached = len(hits) * self.block_size

    def _schedule_prefill(self, request: Request, out: SchedulerOutput) -> None:
        """Give `request` its next prefill chunk; it stays `prefilling` unless the chunk samples.

        The flag follows the row, not the positions, so a `prefill_row` override decides alone
        where a prefill ends.
        """
        row = self.prefill_row(request, self._budget_left(out))
        request.prefilling = not row.samples
        out.rows.append(row)
        self._cache_full_blocks(request, row.end_position)

    def _budget_left(self, out: SchedulerOutput) -> int | None:
        """Positions the rows decided so far leave of the step's budget; None: no budget."""
        if self.max_num_batched_tokens is None:
            return None
        return self.max_num_batched_tokens - sum(row.num_positions for row in out.rows)

    # -- prefix caching ------------------------------------------------------------------

    def _block_keys(self, request: Request, num_blocks: int) -> list[BlockKey]:
        """The keys of `request`'s first `num_blocks` full blocks, each computed once."""
        keys, size = request.block_keys, self.block_size
        while len(keys) < num_blocks:
            start = len(keys) * size
            keys.append(
                block_hash(keys[-1] if keys else None, request.token_ids[start : start + size])
            )
        return keys[:num_blocks]

    def _cached_prefix(self, request: Request) -> list[int]:
        """The cached blocks a (re)admitted request can take instead of computing them.

        Only full blocks, and never the one holding its last token: the prefill must compute
        at least that position to sample from it, and a shared block is never written. None
        for a request that wants its prompt's logprobs: only a computed position has logits.
        """
        if not self.enable_prefix_caching or request.params.prompt_logprobs is not None:
            return []
        usable = (request.num_tokens - 1) // self.block_size
        return self.pool.lookup(self._block_keys(request, usable))

    def _cache_full_blocks(self, request: Request, end_position: int) -> None:
        """Offer the cache every block of `request` that the forward just decided fills.

        Called when a row is decided, before the forward runs: the forward writes each row's
        K/V in a layer before any row reads it, so a request admitted later in the same step
        (the other samples of an `n > 1` request) can already share these blocks.
        """
        if not self.enable_prefix_caching:
            return
        table = request.block_table
        full = end_position // self.block_size
        keys = self._block_keys(request, full)
        for index in range(request.num_registered_blocks, full):
            if self.pool.key_of(table.block_ids[index]) is None:
                self.pool.register(table.block_ids[index], keys[index])
        request.num_registered_blocks = max(request.num_registered_blocks, full)

    def free_blocks_to_keep(self) -> int:
        """Free blocks an admission or a swap-in must leave in the pool: the watermark.

        Growth may spend them; only newcomers are refused. (Lesson 17 replaces this rule with
        a one-step lookahead reserve and measures both.)
        """
        return self.watermark

    def _seat(self, request: Request) -> None:
        """Put `request` among the running ones by seniority, which growth relies on.

        Under recompute alone everyone waiting is younger than everyone running, so this is
        an append. Not so with swap: swapped requests come back first out first in, so an
        older victim returns after a younger one, and a request preempted by recompute can be
        admitted after a younger one came back from swap.
        """
        insort(self.running, request, key=lambda running: running.arrival)

    def select_victim(self, candidates: list[Request]) -> Request:
        """Whom to preempt when growth finds the pool dry: the youngest candidate.

        `candidates` are the running requests, oldest first, from the one that needs a block
        to the youngest. Seniority is what makes growth terminate: the oldest running request
        is never a victim, so it always reaches its last token and frees its blocks.
        """
        return candidates[-1]

    def prefill_row(self, request: Request, max_positions: int | None = None) -> ScheduledRow:
        """The next chunk of `request`'s prefill: from its first position without K/V, at most
        `max_positions` of them (None: all the rest).

        Admission starts it at 0, over the prompt, or for a resumed request over prompt plus
        the tokens it generated: resume, not restart, so it samples the token it would have
        sampled anyway. The chunk that reaches its last token samples; the others do not.
        """
        start = request.block_table.num_tokens
        end = request.num_tokens
        if max_positions is not None:
            end = min(end, start + max_positions)
        return ScheduledRow(
            request,
            start_position=start,
            num_positions=end - start,
            is_prefill=True,
            recomputed=max(0, min(end, request.num_discarded_tokens) - start),
            samples=end == request.num_tokens,
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

    def _evict(self, victim: Request, out: SchedulerOutput) -> None:
        """Preempt `victim` by swap when the swap space holds its blocks, else by recompute."""
        if self.policy == "reserve":
            raise AssertionError("the reserve policy never runs short, so never preempts")
        out.preempted.append(victim)
        swap = self.swap_pool
        if (
            swap is not None
            and not victim.prefilling
            and swap.can_allocate(len(victim.block_table.block_ids))
        ):
            out.blocks_to_swap_out.extend(self._swap_out(victim))
            out.swapped_out.append(victim)
        else:
            self._preempt(victim)

    def _preempt(self, request: Request) -> None:
        """Preemption by recompute: blocks and slot back, tokens kept, head of the queue.

        Records what the eviction throws away for the resumed prefill's `recomputed`: the
        positions with K/V of a prefill cut short, every token of a decoding request.
        """
        lost = request.block_table.num_tokens if request.prefilling else request.num_tokens
        request.num_discarded_tokens = max(request.num_discarded_tokens, lost)
        request.prefilling = False
        self.running.remove(request)
        self._release(request)
        request.move_to(RequestState.WAITING)
        request.num_preemptions += 1
        self.waiting.appendleft(request)

    def _swap_out(self, request: Request) -> list[tuple[int, int]]:
        """Preemption by swap: K/V to host blocks, slot back, tokens kept, tail of the swap queue.

        Returns the (device block, host block) pairs the engine must copy before the forward.
        """
        self.running.remove(request)
        host_ids = self.swap_pool.allocate(len(request.block_table.block_ids))
        device_ids = request.block_table.relocate(host_ids)
        self._release_slot(request)
        self._free_device_blocks(request, device_ids)
        request.move_to(RequestState.SWAPPED)
        request.num_preemptions += 1
        request.num_swaps += 1
        self.swapped.append(request)
        return list(zip(device_ids, host_ids, strict=True))

    def _release(self, request: Request) -> None:
        self._release_slot(request)
        self._free_device_blocks(request, request.block_table.release())

    def _free_device_blocks(self, request: Request, block_ids: list[int]) -> None:
        """Give back a request's device blocks; cached ones stay cached until evicted.

        Under prefix caching the tail goes back first, so it is evicted before the prefix
        that other requests are likelier to share.
        """
        request.num_registered_blocks = 0
        self.pool.free(block_ids[::-1] if self.enable_prefix_caching else block_ids)

    def _release_slot(self, request: Request) -> None:
        # The hook runs while the request still names its slot, so the engine knows which
        # row to reset before the slot can be handed to anyone else.
        if self.on_release is not None:
            self.on_release(request)
        self.free_slots.append(request.slot)
        request.slot = None

    # -- after the forward -------------------------------------------------------------

    def update(
        self, out: SchedulerOutput, tokens: dict[int, int], eos_token_ids: tuple[int, ...] = ()
    ) -> list[Request]:
        """Record each row's sampled token; release and return the requests it finished.

        A row that `samples` gets its token from `tokens`; a chunk that does not, or a row
        without a token (its sampling failed: the engine aborts it next), only advances its
        request's table. Rows come in the order `schedule()` made them (the
        decoding running requests oldest first, the swapped-in, the unfinished prefill, then
        the admitted), and finished requests give their blocks back in that order.
        """
        finished = []
        for row in out.rows:
            request = row.request
            request.block_table.append(row.num_positions)
            if not row.samples or request.request_id not in tokens:
                continue
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
        """Free plus held equals each pool, no block held twice, every slot accounted for.

        Cheap enough to call after every step, which is what the tests do.
        """
        self.pool.check_integrity()
        held = [b for r in self.running for b in r.block_table.block_ids]
        if self.enable_prefix_caching:  # shared blocks: each held once per table naming it
            self.pool.check_refcounts(r.block_table.block_ids for r in self.running)
        elif len(held) != len(set(held)):
            raise AssertionError("a block is held by two requests")
        if set(held) != self.pool.held_ids:
            raise AssertionError("the requests' block tables and the pool disagree")
        slots = [r.slot for r in self.running] + list(self.free_slots)
        if sorted(slots) != list(range(self.num_slots)):
            raise AssertionError(f"slots unaccounted for: running+free = {sorted(slots)}")
        prefilling = [request for request in self.running if request.prefilling]
        if len(prefilling) > 1:
            raise AssertionError(f"{len(prefilling)} requests part way through their prefill")
        for request in prefilling:
            table = request.block_table
            if not table.num_tokens < request.num_tokens <= table.capacity:
                raise AssertionError(
                    f"request {request.request_id} mid-prefill has {table.num_tokens} positions "
                    f"computed of {request.num_tokens} in blocks for {table.capacity}"
                )
        for request in self.waiting:
            if request.block_table.block_ids or request.slot is not None or request.prefilling:
                raise AssertionError(f"waiting request {request.request_id} holds resources")
        arrivals = [r.arrival for r in self.running]
        if arrivals != sorted(arrivals):
            raise AssertionError("running requests are not in seniority order")
        self._check_swap_integrity()

    def _check_swap_integrity(self) -> None:
        """The swap space's own pool check, and each swapped request's K/V whole in it."""
        if self.swap_pool is not None:
            self.swap_pool.check_integrity()
        held = [b for r in self.swapped for b in r.block_table.block_ids]
        if len(held) != len(set(held)):
            raise AssertionError("a swap block is held by two requests")
        if set(held) != (self.swap_pool.held_ids if self.swap_pool else frozenset()):
            raise AssertionError("the swapped requests' block tables and the swap space disagree")
        for request in self.swapped:
            table = request.block_table
            if request.state is not RequestState.SWAPPED or request.slot is not None:
                raise AssertionError(f"request {request.request_id} in swap is not just swapped")
            # Every position but the last sampled token has K/V, and it all went to swap.
            if table.num_tokens != request.num_tokens - 1 or len(table.block_ids) != (
                blocks_for_length(table.num_tokens, self.block_size)
            ):
                raise AssertionError(
                    f"swapped request {request.request_id} holds {len(table.block_ids)} blocks "
                    f"for {table.num_tokens} positions of {request.num_tokens} tokens"
                )
