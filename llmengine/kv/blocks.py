"""The integer side of the paged KV cache: the rounding rule, the block pool, block tables.

Nothing here touches a tensor. A block is an id into the cache's storage; a sequence owns an
ordered list of them (its block table); the pool hands them out and takes them back. The
scheduler reasons entirely in these integers, which is why it can be tested without a model.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


def blocks_for_length(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold `num_tokens` positions: ceil(num_tokens / block_size).

    The one rounding rule of the project; every allocation decision goes through it.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be non-negative, got {num_tokens}")
    return -(-num_tokens // block_size)


class BlockPool:
    """A fixed number of KV blocks, a free list, and who holds what.

    `allocate` is all or nothing: asking for more than is free raises and changes nothing, so
    a caller never has to roll back a partial allocation. `free` refuses ids it never handed
    out and ids already free, the two ways a bookkeeping bug would otherwise surface much
    later as one sequence reading another's K/V.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"a pool needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._held: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_held(self) -> int:
        return len(self._held)

    @property
    def held_ids(self) -> frozenset[int]:
        return frozenset(self._held)

    def can_allocate(self, n: int) -> bool:
        return 0 <= n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Hand out `n` free block ids, oldest-freed first."""
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of blocks ({n})")
        if n > len(self._free):
            raise ValueError(
                f"asked for {n} blocks, only {len(self._free)} of {self.num_blocks} free"
            )
        ids = [self._free.popleft() for _ in range(n)]
        self._held.update(ids)
        return ids

    def free(self, ids: list[int]) -> None:
        """Take back blocks; validates every id before returning any of them."""
        seen: set[int] = set()
        for block_id in ids:
            if not 0 <= block_id < self.num_blocks:
                raise ValueError(f"block {block_id} was never handed out by this pool")
            if block_id not in self._held or block_id in seen:
                raise ValueError(f"block {block_id} is already free (double free)")
            seen.add(block_id)
        self._held.difference_update(ids)
        self._free.extend(ids)

    def check_integrity(self) -> None:
        """Free plus held equals the pool, and no block is both: callable at any time."""
        free = set(self._free)
        if len(free) != len(self._free):
            raise AssertionError("a block appears twice in the free list")
        if free & self._held:
            raise AssertionError(f"blocks both free and held: {sorted(free & self._held)}")
        if len(free) + len(self._held) != self.num_blocks:
            raise AssertionError(
                f"free {len(free)} + held {len(self._held)} != pool {self.num_blocks}"
            )


@dataclass(slots=True)
class BlockTable:
    """One sequence's blocks in order, and how many positions it has written.

    The table never allocates on its own: blocks arrive through `extend`, handed over by the
    scheduler that took them from the pool. A table that quietly allocated when it ran short
    would book the pool twice for one sequence behind the scheduler's back, so running out is
    an error here.
    """

    block_size: int
    block_ids: list[int] = field(default_factory=list)
    num_tokens: int = 0

    @property
    def capacity(self) -> int:
        return len(self.block_ids) * self.block_size

    def extend(self, block_ids: list[int]) -> None:
        """Adopt blocks the scheduler just allocated for this sequence."""
        self.block_ids.extend(block_ids)

    def append(self, count: int = 1) -> None:
        """Record `count` more positions written; raises if the blocks cannot hold them."""
        if self.num_tokens + count > self.capacity:
            raise ValueError(
                f"block table holds {self.capacity} positions in {len(self.block_ids)} blocks; "
                f"cannot append {count} to {self.num_tokens} (the scheduler must extend it first)"
            )
        self.num_tokens += count

    def location_of(self, position: int) -> tuple[int, int]:
        """The (block id, offset) where `position`'s K/V lives."""
        if not 0 <= position < self.capacity:
            raise IndexError(f"position {position} outside this table's {self.capacity} positions")
        return self.block_ids[position // self.block_size], position % self.block_size

    def detach(self) -> list[int]:
        """Hand back the blocks but keep the count of positions written: what a swap out does,
        whose K/V now lives in the host swap space until blocks are extended in again."""
        ids, self.block_ids = self.block_ids, []
        return ids

    def trim(self) -> list[int]:
        """Hand back the blocks past the last position written (bought for positions a
        forward computed and then discarded: rejected drafts); returns them, for the pool."""
        keep = -(-self.num_tokens // self.block_size)
        ids, self.block_ids = self.block_ids[keep:], self.block_ids[:keep]
        return ids

    def release(self) -> list[int]:
        """Empty the table and return the blocks it held, for the pool."""
        ids, self.block_ids, self.num_tokens = self.block_ids, [], 0
        return ids
