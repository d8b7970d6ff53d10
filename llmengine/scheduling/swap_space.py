"""Host memory for preempted requests' K/V, and the queue of requests waiting in it.

Preemption by swap copies a victim's K/V blocks to host blocks and back when it resumes, so
it recomputes nothing. The host blocks come from a second `BlockPool`, integers naming rows
of the cache's host tensors; this module keeps which host blocks hold which request's K/V
and the order the requests left in, which is the order they come back in. It says which
block goes where; the cache does the copying. Nothing here touches a tensor.
"""

from __future__ import annotations

from collections import deque

from llmengine.kv.blocks import BlockPool, blocks_for_length
from llmengine.scheduling.request import Request, RequestState


class SwapSpace:
    """`num_blocks` host blocks (0: no swap space, every victim is preempted by recompute)."""

    def __init__(self, num_blocks: int) -> None:
        self.pool = BlockPool(num_blocks) if num_blocks else None
        self.queue: deque[Request] = deque()
        self._host_blocks: dict[int, list[int]] = {}

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks if self.pool else 0

    @property
    def num_free(self) -> int:
        return self.pool.num_free if self.pool else 0

    @property
    def num_held(self) -> int:
        return self.pool.num_held if self.pool else 0

    def can_hold(self, num_blocks: int) -> bool:
        return self.pool is not None and self.pool.can_allocate(num_blocks)

    def swap_out(self, request: Request, device_ids: list[int]) -> list[tuple[int, int]]:
        """Book host blocks for the K/V in `device_ids` and queue `request` at the tail.

        Returns the (device block, host block) copies to make before the forward.
        """
        assert self.pool is not None, "swap_out needs can_hold first"
        host_ids = self.pool.allocate(len(device_ids))
        self._host_blocks[request.request_id] = host_ids
        self.queue.append(request)
        return list(zip(device_ids, host_ids, strict=True))

    def swap_in(self, request: Request, device_ids: list[int]) -> list[tuple[int, int]]:
        """Take the head of the queue back onto `device_ids`, one per host block it holds.

        Returns the (host block, device block) copies to make before the forward.
        """
        if not self.queue or self.queue[0] is not request:
            raise ValueError(f"request {request.request_id} is not at the head of the swap queue")
        self.queue.popleft()
        host_ids = self._host_blocks.pop(request.request_id)
        self.pool.free(host_ids)
        return list(zip(host_ids, device_ids, strict=True))

    def host_blocks_of(self, request: Request) -> list[int]:
        """The host blocks holding a swapped request's K/V."""
        return list(self._host_blocks[request.request_id])

    def abort(self, request: Request) -> None:
        """Drop a swapped request: its host blocks go back, it leaves the queue."""
        self.queue.remove(request)
        self.pool.free(self._host_blocks.pop(request.request_id))

    def check_integrity(self, block_size: int) -> None:
        """The host pool's own check; each queued request swapped, slotless, its K/V whole.

        A swapped request left decoding, so every position but its last sampled token has
        K/V, all of it in host blocks, none on the device.
        """
        if self.pool is not None:
            self.pool.check_integrity()
        held = [block for blocks in self._host_blocks.values() for block in blocks]
        if len(held) != len(set(held)) or set(held) != (self.pool.held_ids if self.pool else set()):
            raise AssertionError("the swapped requests' host blocks and the swap space disagree")
        if [request.request_id for request in self.queue] != list(self._host_blocks):
            raise AssertionError("the swap queue and the host block records disagree")
        for request in self.queue:
            table = request.block_table
            if request.state is not RequestState.SWAPPED or request.slot is not None:
                raise AssertionError(f"request {request.request_id} in swap is not just swapped")
            host = self._host_blocks[request.request_id]
            if (
                table.block_ids
                or table.num_tokens != request.num_tokens - 1
                or len(host) != blocks_for_length(table.num_tokens, block_size)
            ):
                raise AssertionError(
                    f"swapped request {request.request_id} holds {len(host)} host and "
                    f"{len(table.block_ids)} device blocks for {table.num_tokens} positions of "
                    f"{request.num_tokens} tokens"
                )
