"""The engine's state as the dashboard draws it: the pool's blocks by owner and the queues.

Read on the engine thread only (the scheduler is not thread-safe), after a step, and turned
into plain lists that `json.dumps` writes compactly. Block owners are request ids, or one of
two codes: `FREE` (no K/V) and `CACHED` (a prefix-cached block nobody holds: its K/V is kept
until the pool hands the block out again). A block shared by several requests (a cached
prefix) is drawn as its oldest holder's. Runs of equal owners are run-length encoded as
`[owner, count]` pairs, so an idle pool of thousands of blocks is one pair.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from llmengine.engine import Engine
from llmengine.kv.prefix_cache import CachingBlockPool
from llmengine.scheduling.request import Request, RequestState

FREE = -1
CACHED = -2


def run_length(owners: Sequence[int]) -> list[list[int]]:
    """`[owner, count]` for each run of equal owners, in block order."""
    runs: list[list[int]] = []
    for owner in owners:
        if runs and runs[-1][0] == owner:
            runs[-1][1] += 1
        else:
            runs.append([owner, 1])
    return runs


def device_owners(engine: Engine) -> list[int]:
    """Each device block's owner: the oldest running request holding it, `CACHED` or `FREE`."""
    scheduler = engine.scheduler
    owners = [FREE] * engine.num_blocks
    pool = scheduler.pool
    if isinstance(pool, CachingBlockPool):
        for block_id in pool.evictable_ids:
            owners[block_id] = CACHED
    for request in reversed(scheduler.running):  # oldest last, so the oldest holder wins
        for block_id in request.block_table.block_ids:
            owners[block_id] = request.request_id
    return owners


def host_owners(engine: Engine) -> list[int]:
    """Each host swap block's owner: the swapped-out request whose K/V it holds, or `FREE`."""
    swap = engine.scheduler.swap
    owners = [FREE] * swap.num_blocks
    for request in swap.queue:
        for block_id in swap.host_blocks_of(request):
            owners[block_id] = request.request_id
    return owners


def state_of(request: Request) -> str:
    """What a queued request is doing: prefill, decode, waiting, preempted (waiting again
    after an eviction by recompute) or swapped."""
    if request.state is RequestState.RUNNING:
        return "prefill" if request.prefilling else "decode"
    if request.state is RequestState.WAITING:
        return "preempted" if request.num_preemptions else "waiting"
    return request.state.value


def queue_rows(requests: Iterable[Request]) -> list[list[Any]]:
    """`[id, prompt tokens, tokens generated so far, state]` per request, in queue order."""
    return [
        [r.request_id, len(r.prompt_token_ids), r.num_output_tokens, state_of(r)] for r in requests
    ]


def engine_state(engine: Engine) -> dict[str, Any]:
    """The pool (device and host) and the three queues, as the snapshot carries them.

    Running requests are listed by seniority (the scheduler keeps them so), waiting ones in
    the order they will be admitted, swapped ones in the order they come back."""
    scheduler = engine.scheduler
    return {
        "pool": {
            "size": engine.num_blocks,
            "block_size": engine.block_size,
            "owners": run_length(device_owners(engine)),
        },
        "host": {"size": engine.num_swap_blocks, "owners": run_length(host_owners(engine))},
        "running": queue_rows(scheduler.running),
        "waiting": queue_rows(scheduler.waiting),
        "swapped": queue_rows(scheduler.swapped),
    }
