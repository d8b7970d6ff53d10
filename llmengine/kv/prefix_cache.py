"""The integer side of prefix caching: block keys and a block pool with refcounts and a cache.

A full block is named by its tokens chained to the key of the block before it, so two blocks
have equal keys exactly when their sequences agree on every token from position 0 through the
end of that block: then their K/V are equal too, and one block can serve both. The pool below
counts how many block tables name each block, keeps blocks whose last holder left in the cache
(evictable, least recently used first) and hands them out again only when no truly free block
is left. Like `blocks.py`, nothing here touches a tensor.
"""

from __future__ import annotations

import operator
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable, Sequence

# Stands in for "no parent" in the hash. Not hash(None): before Python 3.12 that depends on an
# address, so keys would hash differently in every process.
_ROOT_HASH = 0


class BlockKey:
    """The name of one full block: its tokens and its parent block's key, compared exactly.

    The key holds its parent key itself, not only the parent's hash, and equality walks the
    chain, so two keys are equal only when every token of both prefixes is; a hash collision can
    cost a dictionary probe, never a wrong match (a design that kept only the parent's hash
    would let two different prefixes with colliding hashes share K/V). The hash is computed once,
    from ints only, so it is the same in every process. `depth` is the block's index plus one.
    """

    __slots__ = ("parent", "tokens", "depth", "_hash")

    def __init__(self, parent: BlockKey | None, tokens: tuple[int, ...]) -> None:
        self.parent = parent
        self.tokens = tokens
        self.depth = 1 if parent is None else parent.depth + 1
        parent_hash = _ROOT_HASH if parent is None else parent._hash
        self._hash = hash((parent_hash, tokens))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BlockKey):
            return NotImplemented
        a: BlockKey | None = self
        b: BlockKey | None = other
        # A loop, not recursion: chains are as long as the sequence. It stops at the first
        # shared ancestor object, which keys built from one another mostly reach at once.
        while a is not b:
            if a is None or b is None:
                return False
            if a._hash != b._hash or a.depth != b.depth or a.tokens != b.tokens:
                return False
            a, b = a.parent, b.parent
        return True

    def __repr__(self) -> str:
        return f"BlockKey(depth={self.depth}, hash={self._hash}, tokens={self.tokens})"


def block_key(parent: BlockKey | None, token_ids: Sequence[int]) -> BlockKey:
    """The key of a full block holding `token_ids`, after the block keyed `parent` (or first)."""
    tokens = tuple(map(operator.index, token_ids))
    if not tokens:
        raise ValueError("a block key names a full block; this one has no tokens")
    return BlockKey(parent, tokens)


def prefix_keys(token_ids: Sequence[int], block_size: int) -> list[BlockKey]:
    """The keys of every full block of `token_ids`, in order; a partial last block has none."""
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    keys: list[BlockKey] = []
    parent: BlockKey | None = None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = block_key(parent, token_ids[start : start + block_size])
        keys.append(parent)
    return keys


class CachingBlockPool:
    """A `BlockPool` whose blocks can be shared, counted, and kept after their last holder.

    Every block is in exactly one of three sets: truly free (no key, no holder), held (refcount
    above 0, keyed or not), or evictable (keyed, refcount 0, in least-recently-used order). An
    evictable block still holds valid K/V a later request can `take`; it is also free for
    admission, since `allocate` hands it out (forgetting its key) once no truly free block is
    left. `free` appends blocks to the eviction order in the order given, so a caller that frees
    a block table back to front has the tail blocks evicted before the prefix others share.

    `evictions` counts the cached blocks `allocate` has handed out again, their keys forgotten.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"a pool needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._refcount: dict[int, int] = {}
        self._key_of: dict[int, BlockKey] = {}
        self._block_of: dict[BlockKey, int] = {}
        self.evictions = 0

    # -- sizes -------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        """Blocks `allocate` can hand out: truly free plus evictable cached ones."""
        return len(self._free) + len(self._evictable)

    @property
    def num_held(self) -> int:
        return len(self._refcount)

    @property
    def held_ids(self) -> frozenset[int]:
        return frozenset(self._refcount)

    @property
    def evictable_ids(self) -> frozenset[int]:
        """Cached blocks no request holds: free for allocation, K/V still valid."""
        return frozenset(self._evictable)

    def refcount(self, block_id: int) -> int:
        """How many holders a block has (0 when free or evictable)."""
        self._check_id(block_id)
        return self._refcount.get(block_id, 0)

    def key_of(self, block_id: int) -> BlockKey | None:
        """The key a block is cached under, or None."""
        self._check_id(block_id)
        return self._key_of.get(block_id)

    # -- handing out and taking back ---------------------------------------------------

    def can_allocate(self, n: int) -> bool:
        return 0 <= n <= self.num_free

    def allocate(self, n: int) -> list[int]:
        """Hand out `n` blocks with refcount 1: truly free first, then evict LRU cached ones.

        All or nothing: asking for more than `num_free` raises and changes nothing.
        """
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of blocks ({n})")
        if n > self.num_free:
            raise ValueError(
                f"asked for {n} blocks, only {self.num_free} of {self.num_blocks} free"
            )
        ids = [self._free.popleft() for _ in range(min(n, len(self._free)))]
        while len(ids) < n:
            block_id, _ = self._evictable.popitem(last=False)
            del self._block_of[self._key_of.pop(block_id)]
            self.evictions += 1
            ids.append(block_id)
        for block_id in ids:
            self._refcount[block_id] = 1
        return ids

    def free(self, ids: Sequence[int]) -> None:
        """Drop one reference per id; a block left with none is cached if keyed, else free.

        Validates every id before changing anything: an id the pool never handed out, or more
        references dropped than a block has (a double free), raises with the pool unchanged.
        """
        for block_id, count in Counter(ids).items():
            self._check_id(block_id)
            if count > self._refcount.get(block_id, 0):
                raise ValueError(
                    f"block {block_id} freed {count} times but has "
                    f"{self._refcount.get(block_id, 0)} holders (double free)"
                )
        for block_id in ids:
            self._refcount[block_id] -= 1
            if self._refcount[block_id]:
                continue
            del self._refcount[block_id]
            if block_id in self._key_of:
                self._evictable[block_id] = None
            else:
                self._free.append(block_id)

    # -- the cache ---------------------------------------------------------------------

    def register(self, block_id: int, key: BlockKey) -> bool:
        """Cache a held block that has just become full under `key`; True if it now is.

        A block is registered at most once (its tokens never change while it is held). When
        `key` is already cached under another block, that one stays and this call returns False:
        two requests that missed the cache together computed the same block twice, lookups may
        already lead to the first, and one key names one block. The duplicate stays unkeyed and
        goes back to the free list when its holders free it.
        """
        self._check_id(block_id)
        if block_id not in self._refcount:
            raise ValueError(f"block {block_id} is not held: only a held block can be registered")
        if block_id in self._key_of:
            raise ValueError(f"block {block_id} is already registered")
        if key in self._block_of:
            return False
        self._key_of[block_id] = key
        self._block_of[key] = block_id
        return True

    def uncache(self, block_ids: Sequence[int]) -> None:
        """Forget the keys of these blocks (those that have one): their K/V is not what the
        key says (a forward that was to write it failed). A held block stays held, unkeyed;
        an evictable one becomes free."""
        for block_id in block_ids:
            key = self._key_of.pop(block_id, None)
            if key is None:
                continue
            del self._block_of[key]
            if block_id in self._evictable:
                del self._evictable[block_id]
                self._free.append(block_id)

    def lookup(self, keys: Sequence[BlockKey]) -> list[int]:
        """The cached blocks (held or evictable) of the longest leading run of `keys`.

        Stops at the first miss: a block's K/V is only usable after all its predecessors'.
        Changes nothing.
        """
        found: list[int] = []
        previous: BlockKey | None = None
        for key in keys:
            probe = key
            if previous is not None and key.parent is previous:
                # An equal key hung on the cached parent object: comparing it with the cached
                # child then stops at that shared parent instead of walking the whole chain.
                probe = BlockKey(self._key_of[found[-1]], key.tokens)
            block_id = self._block_of.get(probe)
            if block_id is None:
                break
            found.append(block_id)
            previous = key
        return found

    def take(self, block_ids: Sequence[int]) -> None:
        """Add one holder to each cached block (as `lookup` found them); evictable ones leave
        the eviction order. Validates first: an uncached block raises with the pool unchanged.
        """
        for block_id in block_ids:
            self._check_id(block_id)
            if block_id not in self._key_of:
                raise ValueError(f"block {block_id} is not cached: it cannot be taken")
        for block_id in block_ids:
            self._evictable.pop(block_id, None)
            self._refcount[block_id] = self._refcount.get(block_id, 0) + 1

    # -- integrity ---------------------------------------------------------------------

    def _check_id(self, block_id: int) -> None:
        if not 0 <= block_id < self.num_blocks:
            raise ValueError(f"block {block_id} was never handed out by this pool")

    def check_integrity(self) -> None:
        """Free, evictable and held partition the pool; refcounts and keys agree with them."""
        free, evictable, held = set(self._free), set(self._evictable), set(self._refcount)
        if len(free) != len(self._free):
            raise AssertionError("a block appears twice in the free list")
        for name, a, b in (
            ("free and evictable", free, evictable),
            ("free and held", free, held),
            ("evictable and held", evictable, held),
        ):
            if a & b:
                raise AssertionError(f"blocks both {name}: {sorted(a & b)}")
        if len(free) + len(evictable) + len(held) != self.num_blocks:
            raise AssertionError(
                f"free {len(free)} + evictable {len(evictable)} + held {len(held)} "
                f"!= pool {self.num_blocks}"
            )
        if any(count < 1 for count in self._refcount.values()):
            raise AssertionError("a held block has a refcount below 1")
        if free & set(self._key_of) or not evictable <= set(self._key_of):
            raise AssertionError("a free block has a key, or an evictable one has none")
        if len(self._block_of) != len(self._key_of) or any(
            self._key_of.get(block_id) is not key for key, block_id in self._block_of.items()
        ):
            raise AssertionError("the key -> block and block -> key maps disagree")

    def check_refcounts(self, tables: Iterable[Sequence[int]]) -> None:
        """Each held block's refcount is the number of block tables naming it, and no table
        names a block that is not held."""
        named = Counter(block_id for table in tables for block_id in table)
        if named != Counter(self._refcount):
            wrong = sorted(
                b for b in set(named) | set(self._refcount) if named[b] != self._refcount.get(b, 0)
            )
            raise AssertionError(f"refcounts disagree with the block tables for blocks {wrong}")
