"""The device pool as the scheduler uses it: a request's blocks bought, shared and given back.

`BlockManager` is the plain pool; `CachingBlockManager` adds prefix caching behind the same
methods (a request's cached prefix, the blocks a decision fills offered to the cache, blocks
given back tail first), so the scheduler asks the same questions whether caching is on or off.
The scheduler decides how many blocks a request needs and when; the manager only moves them
between the pool and the request's block table. Nothing here touches a tensor.
"""

from __future__ import annotations

from llmengine.kv.blocks import BlockPool
from llmengine.kv.prefix_cache import BlockKey, CachingBlockPool, block_key
from llmengine.scheduling.request import Request


class BlockManager:
    """A `BlockPool` of `num_blocks` device blocks of `block_size` tokens, and the tables
    that hold them."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.pool: BlockPool | CachingBlockPool = BlockPool(num_blocks)
        self.block_size = block_size

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free(self) -> int:
        """Blocks an allocation can have now (under caching, evictable cached ones too)."""
        return self.pool.num_free

    @property
    def num_held(self) -> int:
        return self.pool.num_held

    def can_allocate(self, n: int) -> bool:
        return self.pool.can_allocate(n)

    def allocate(self, request: Request, n: int) -> list[int]:
        """Buy `n` blocks onto the end of `request`'s table; returns them."""
        block_ids = self.pool.allocate(n)
        request.block_table.extend(block_ids)
        return block_ids

    def cached_prefix(self, request: Request) -> list[int]:
        """The cached blocks a (re)admitted request can take instead of computing: none."""
        return []

    def admission_cost(self, hits: list[int], needed: int) -> int:
        """Free blocks an admission that takes `hits` and buys `needed` more removes."""
        return needed

    def admit(self, request: Request, hits: list[int], needed: int) -> None:
        """Give a (re)admitted request its cached prefix `hits` and `needed` fresh blocks."""
        self.allocate(request, needed)

    def offer_full_blocks(self, request: Request, end_position: int) -> list[int]:
        """A row of `request` computes up to `end_position`: nothing to cache (the blocks it
        registered in the cache: none)."""
        return []

    def uncache(self, block_ids: list[int]) -> None:
        """Blocks whose K/V a failed forward never wrote: nothing cached, nothing to forget."""

    def free(self, request: Request) -> None:
        """Empty `request`'s table (positions and blocks) and give its blocks back."""
        self._give_back(request, request.block_table.release())

    def trim(self, request: Request) -> None:
        """Give back `request`'s blocks past its last written position. They were never full
        of its own tokens, so never offered to a cache: the pool takes them as fresh."""
        self.pool.free(request.block_table.trim())

    def detach(self, request: Request) -> list[int]:
        """Give `request`'s blocks back but keep its count of positions written: their K/V
        is being copied elsewhere (a swap out). Returns the blocks, for the copy."""
        block_ids = request.block_table.detach()
        self._give_back(request, block_ids)
        return block_ids

    def _give_back(self, request: Request, block_ids: list[int]) -> None:
        self.pool.free(block_ids)

    def check_integrity(self, holders: list[Request]) -> None:
        """The pool's own check, and the `holders`' block tables name exactly its held
        blocks, none of them twice."""
        self.pool.check_integrity()
        held = [block for request in holders for block in request.block_table.block_ids]
        if len(held) != len(set(held)):
            raise AssertionError("a block is held by two requests")
        if set(held) != self.pool.held_ids:
            raise AssertionError("the requests' block tables and the pool disagree")


class CachingBlockManager(BlockManager):
    """The plain manager over a `CachingBlockPool`: full blocks are shared between requests
    whose tokens agree up to the end of the block, and kept after their last holder leaves.

    A block is offered to the cache when the row that fills it is decided, before the forward
    runs. That is safe because the forward writes every row's K/V in a layer before any row
    reads it, and it is what lets a request admitted later in the same decision (another
    sample of an `n > 1` request) share the blocks at once instead of computing them again.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self.pool: CachingBlockPool = CachingBlockPool(num_blocks)

    def cached_prefix(self, request: Request) -> list[int]:
        """Its leading cached full blocks, never the one holding its last token (the prefill
        must compute that position to sample from it, and a shared block is never written).
        None for a request that wants its prompt's logprobs: only a computed position has
        logits."""
        if request.params.prompt_logprobs is not None:
            return []
        usable = (request.num_tokens - 1) // self.block_size
        return self.pool.lookup(self._block_keys(request, usable))

    def admission_cost(self, hits: list[int], needed: int) -> int:
        """A hit is held, not bought, but an evictable one was counted free until taken."""
        return needed + sum(self.pool.refcount(block) == 0 for block in hits)

    def admit(self, request: Request, hits: list[int], needed: int) -> None:
        if hits:
            self.pool.take(hits)
            request.block_table.extend(hits)
            request.block_table.append(len(hits) * self.block_size)
        self.allocate(request, needed)

    def offer_full_blocks(self, request: Request, end_position: int) -> list[int]:
        """Register every block of `request` that positions up to `end_position` fill; the
        blocks this call registered."""
        table = request.block_table
        full = end_position // self.block_size
        keys = self._block_keys(request, full)
        registered = []
        for index in range(request.num_registered_blocks, full):
            block_id = table.block_ids[index]
            if self.pool.key_of(block_id) is None and self.pool.register(block_id, keys[index]):
                registered.append(block_id)
        request.num_registered_blocks = max(request.num_registered_blocks, full)
        return registered

    def uncache(self, block_ids: list[int]) -> None:
        """Forget the keys of blocks whose K/V a failed forward never wrote, so that no later
        request finds them."""
        self.pool.uncache(block_ids)

    def _give_back(self, request: Request, block_ids: list[int]) -> None:
        """Tail first, so the pool evicts a request's tail before the prefix other requests
        are likelier to share; cached blocks stay cached until evicted."""
        request.num_registered_blocks = 0
        self.pool.free(block_ids[::-1])

    def check_integrity(self, holders: list[Request]) -> None:
        """Shared blocks are held once per table naming them: refcounts, not uniqueness."""
        self.pool.check_integrity()
        tables = [request.block_table.block_ids for request in holders]
        self.pool.check_refcounts(tables)
        if {block for table in tables for block in table} != self.pool.held_ids:
            raise AssertionError("the requests' block tables and the pool disagree")

    def _block_keys(self, request: Request, num_blocks: int) -> list[BlockKey]:
        """The keys of `request`'s first `num_blocks` full blocks, each computed once."""
        keys, size = request.block_keys, self.block_size
        while len(keys) < num_blocks:
            start = len(keys) * size
            parent = keys[-1] if keys else None
            keys.append(block_key(parent, request.token_ids[start : start + size]))
        return keys[:num_blocks]
