"""Prefix caching's integer side: chained block keys and the refcounted, caching block pool."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from dataclasses import dataclass, field

import pytest
from pool_helpers import num_evictable, num_keyed

from llmengine.kv.blocks import blocks_for_length
from llmengine.kv.prefix_cache import CachingBlockPool, block_key, prefix_keys


def snapshot(pool: CachingBlockPool) -> tuple:
    """Everything a caller can observe of a pool, to check that a refused call changed nothing."""
    per_block = [(pool.refcount(b), pool.key_of(b)) for b in range(pool.num_blocks)]
    return per_block, pool.num_free, pool.evictions


def cached_blocks(pool: CachingBlockPool, token_ids: list[int], block_size: int) -> list[int]:
    """Allocate and register one block per full block of `token_ids` (a prefilled prompt)."""
    keys = prefix_keys(token_ids, block_size)
    ids = pool.allocate(len(keys))
    for block_id, key in zip(ids, keys, strict=True):
        assert pool.register(block_id, key)
    return ids


# -- keys ------------------------------------------------------------------------------


def test_equal_prefixes_have_equal_keys_and_a_different_prefix_changes_every_later_key() -> None:
    a = prefix_keys([1, 2, 3, 4, 5, 6], 2)
    b = prefix_keys([1, 2, 3, 4, 5, 6, 7], 2)
    c = prefix_keys([9, 2, 3, 4, 5, 6], 2)
    assert a == b[:3] and hash(a[2]) == hash(b[2])
    # Blocks 1 and 2 hold the same tokens in `a` and `c`, after a different first block.
    assert a[1].tokens == c[1].tokens and all(x != y for x, y in zip(a, c, strict=True))
    assert block_key(a[0], [3, 4]) == a[1] and block_key(None, [3, 4]) != a[1]


def test_a_partial_block_has_no_key() -> None:
    assert len(prefix_keys([1, 2, 3, 4, 5], 2)) == 2
    assert prefix_keys([1], 2) == [] and prefix_keys([], 2) == []
    with pytest.raises(ValueError):
        block_key(None, [])
    with pytest.raises(ValueError):
        prefix_keys([1, 2], 0)


def test_a_hash_collision_never_makes_two_prefixes_share() -> None:
    # On a 64-bit build hash(2**61 - 1) == hash(0), so these two blocks' keys hash alike.
    first, other = block_key(None, [0]), block_key(None, [2**61 - 1])
    child, other_child = block_key(first, [5]), block_key(other, [5])
    assert hash(child) == hash(other_child)
    assert first != other and child != other_child
    pool = CachingBlockPool(4)
    ids = pool.allocate(2)
    assert pool.register(ids[0], first) and pool.register(ids[1], child)
    assert pool.lookup([other, other_child]) == [] and pool.lookup([other_child]) == []
    assert pool.lookup([first, child]) == ids


def test_keys_hash_the_same_in_every_process() -> None:
    script = (
        "from llmengine.kv.prefix_cache import prefix_keys;"
        "print([hash(k) for k in prefix_keys(list(range(40)), 8)])"
    )
    # A hash seed other than this process's: str or None hashing would then differ.
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    env = {**os.environ, "PYTHONHASHSEED": seed}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{[hash(k) for k in prefix_keys(list(range(40)), 8)]}\n"


# -- the pool --------------------------------------------------------------------------


def test_allocate_takes_truly_free_blocks_first_then_evicts_least_recently_used() -> None:
    pool = CachingBlockPool(4)
    a = pool.allocate(3)
    keys = prefix_keys([1, 2, 3, 4], 2)
    pool.register(a[0], keys[0])
    pool.register(a[1], keys[1])
    pool.free([a[1], a[0], a[2]])  # a[1] then a[0] become evictable; a[2] truly free
    assert pool.num_free == 4 and num_evictable(pool) == 2
    untouched = pool.allocate(2)
    assert sorted(untouched) == sorted({0, 1, 2, 3} - {a[0], a[1]})
    assert pool.evictions == 0 and pool.lookup(keys) == [a[0], a[1]]
    assert pool.allocate(1) == [a[1]]  # least recently freed goes first, and its key with it
    assert pool.key_of(a[1]) is None and pool.lookup(keys[1:]) == [] and pool.evictions == 1
    assert pool.allocate(1) == [a[0]] and pool.num_free == 0 and num_keyed(pool) == 0
    pool.check_integrity()


def test_free_keeps_keyed_blocks_cached_and_counts_them_free() -> None:
    pool = CachingBlockPool(3)
    ids = cached_blocks(pool, [7, 7, 8, 8, 9], 2)
    loose = pool.allocate(1)
    assert pool.num_free == 0 and not pool.can_allocate(1)
    pool.free(ids + loose)
    assert pool.num_free == 3 and num_evictable(pool) == 2 and pool.num_held == 0
    assert pool.can_allocate(3) and not pool.can_allocate(4)
    assert pool.lookup(prefix_keys([7, 7, 8, 8, 9], 2)) == ids
    assert [pool.refcount(b) for b in ids] == [0, 0] and pool.key_of(loose[0]) is None
    pool.check_integrity()


def test_uncache_forgets_keys_and_frees_what_nobody_holds() -> None:
    """Blocks whose K/V a failed forward never wrote: a held one stays held but unkeyed, an
    evictable one becomes plainly free, and no lookup finds either."""
    pool = CachingBlockPool(3)
    held, loose = cached_blocks(pool, [4, 4, 5, 5], 2)
    pool.free([loose])
    assert num_evictable(pool) == 1
    pool.uncache([held, loose, 2])  # block 2 was never keyed: nothing to forget
    assert pool.lookup(prefix_keys([4, 4, 5, 5], 2)) == []
    assert pool.key_of(held) is None and pool.refcount(held) == 1
    assert num_evictable(pool) == 0 and num_keyed(pool) == 0 and pool.num_free == 2
    pool.free([held])
    assert pool.num_free == 3
    pool.check_integrity()


def test_take_of_an_evictable_block_removes_it_from_the_eviction_order() -> None:
    pool = CachingBlockPool(2)
    older = cached_blocks(pool, [1, 1], 2)
    newer = cached_blocks(pool, [2, 2], 2)
    pool.free(older + newer)
    pool.take(pool.lookup(prefix_keys([1, 1], 2)))
    assert pool.refcount(older[0]) == 1 and num_evictable(pool) == 1 and pool.num_free == 1
    assert pool.allocate(1) == newer  # the least recently used one is held again, so skipped
    with pytest.raises(ValueError, match="only 0 of 2 free"):
        pool.allocate(1)
    pool.check_integrity()


def test_a_block_with_two_holders_is_cached_only_after_both_free_it() -> None:
    pool = CachingBlockPool(2)
    ids = cached_blocks(pool, [4, 5], 2)
    pool.take(pool.lookup(prefix_keys([4, 5, 6], 2)))
    assert pool.refcount(ids[0]) == 2 and pool.num_held == 1
    pool.check_refcounts([ids, ids])
    pool.free(ids)
    assert pool.refcount(ids[0]) == 1 and num_evictable(pool) == 0 and pool.num_free == 1
    pool.free(ids)
    assert pool.refcount(ids[0]) == 0 and num_evictable(pool) == 1 and pool.num_free == 2
    pool.check_integrity()


def test_double_free_and_foreign_ids_are_refused_and_change_nothing() -> None:
    pool = CachingBlockPool(4)
    ids = cached_blocks(pool, [1, 2, 3, 4], 2)
    loose = pool.allocate(1)
    pool.take(ids[:1])
    pool.free(ids[1:])
    before = snapshot(pool)
    for bad in ([ids[1]], [loose[0], loose[0]], [ids[0], ids[0], ids[0]], [loose[0], ids[1]]):
        with pytest.raises(ValueError, match="double free"):
            pool.free(bad)
        assert snapshot(pool) == before
    for bad in ([4], [-1], [loose[0], 4]):
        with pytest.raises(ValueError, match="never handed out"):
            pool.free(bad)
        assert snapshot(pool) == before
    pool.free([ids[0], ids[0]])  # two holders, two references dropped at once: allowed
    assert pool.refcount(ids[0]) == 0
    pool.check_integrity()


def test_register_once_per_block_and_one_block_per_key() -> None:
    pool = CachingBlockPool(3)
    key = prefix_keys([3, 3], 2)[0]
    first, duplicate = pool.allocate(2)
    assert pool.register(first, key)
    with pytest.raises(ValueError, match="already registered"):
        pool.register(first, prefix_keys([4, 4], 2)[0])
    # The same tokens computed again by another request: the first block stays the cached one.
    assert not pool.register(duplicate, key)
    assert pool.key_of(duplicate) is None and pool.lookup([key]) == [first]
    pool.free([duplicate, first])
    assert num_evictable(pool) == 1 and pool.key_of(first) == key
    with pytest.raises(ValueError, match="not held"):
        pool.register(duplicate, prefix_keys([5, 5], 2)[0])
    with pytest.raises(ValueError, match="never handed out"):
        pool.register(3, key)
    pool.check_integrity()


def test_lookup_returns_the_leading_run_and_stops_at_the_first_miss() -> None:
    pool = CachingBlockPool(4)
    keys = prefix_keys([1, 2, 3, 4, 5, 6], 2)
    ids = pool.allocate(3)
    pool.register(ids[0], keys[0])
    pool.register(ids[2], keys[2])  # cached, but after a miss it cannot be used
    before = [(pool.refcount(b), pool.key_of(b)) for b in range(4)]
    assert pool.lookup(keys) == [ids[0]]
    assert pool.lookup(keys[1:]) == [] and pool.lookup([]) == []
    assert [(pool.refcount(b), pool.key_of(b)) for b in range(4)] == before


def test_lookup_is_exact_for_keys_that_are_not_one_chain() -> None:
    pool = CachingBlockPool(4)
    ids = cached_blocks(pool, [1, 2, 3, 4], 2)
    # Block 1's tokens after another first block, asked right after the cached first block.
    stranger = prefix_keys([9, 9, 3, 4], 2)[1]
    assert pool.lookup([prefix_keys([1, 2], 2)[0], stranger]) == ids[:1]
    # Equal keys built as separate objects (another request's chain) still all hit.
    assert pool.lookup(prefix_keys([1, 2, 3, 4, 5], 2)) == ids


def test_take_refuses_an_uncached_block_and_changes_nothing() -> None:
    pool = CachingBlockPool(3)
    ids = cached_blocks(pool, [1, 1], 2)
    loose = pool.allocate(1)
    before = snapshot(pool)
    for bad in ([ids[0], loose[0]], [2], [5]):
        with pytest.raises(ValueError):
            pool.take(bad)
        assert snapshot(pool) == before


def test_the_integrity_checks_catch_a_corrupted_pool() -> None:
    pool = CachingBlockPool(3)
    ids = cached_blocks(pool, [1, 1, 2, 2], 2)
    pool.check_refcounts([ids])
    with pytest.raises(AssertionError, match="refcounts disagree"):
        pool.check_refcounts([ids, ids[:1]])
    with pytest.raises(AssertionError, match="refcounts disagree"):
        pool.check_refcounts([ids[:1]])
    pool._free.append(ids[0])
    with pytest.raises(AssertionError, match="free and held"):
        pool.check_integrity()


def test_a_pool_needs_a_block() -> None:
    with pytest.raises(ValueError):
        CachingBlockPool(0)


# -- random operations against a model --------------------------------------------------

BLOCK_SIZE = 2
NUM_BLOCKS = 12
BASES = ([], [0, 1, 0], [0, 1, 0, 1, 1, 2], [2, 2])


@dataclass
class Holder:
    tokens: list[int]
    blocks: list[int]


@dataclass
class Model:
    """What the pool should hold, kept without BlockKey: prefixes as tuples of tokens."""

    refcount: dict[int, int] = field(default_factory=dict)
    prefix_of: dict[int, tuple[int, ...]] = field(default_factory=dict)  # block -> cached prefix
    block_of: dict[tuple[int, ...], int] = field(default_factory=dict)
    lru: list[int] = field(default_factory=list)
    hits: int = 0

    def num_truly_free(self) -> int:
        return NUM_BLOCKS - len(self.refcount) - len(self.lru)

    def expected_hits(self, tokens: list[int]) -> list[int]:
        found = []
        for end in range(BLOCK_SIZE, len(tokens) + 1, BLOCK_SIZE):
            if tuple(tokens[:end]) not in self.block_of:
                break
            found.append(self.block_of[tuple(tokens[:end])])
        return found

    def take(self, blocks: list[int]) -> None:
        for b in blocks:
            if b in self.lru:
                self.lru.remove(b)
            self.refcount[b] = self.refcount.get(b, 0) + 1

    def allocated(self, ids: list[int]) -> None:
        """Check an allocation against the model's prediction, then record it."""
        fresh = min(len(ids), self.num_truly_free())
        for b in ids[:fresh]:
            assert b not in self.refcount and b not in self.lru and b not in self.prefix_of
        assert ids[fresh:] == self.lru[: len(ids) - fresh]
        for b in ids[fresh:]:
            self.lru.remove(b)
            del self.block_of[self.prefix_of.pop(b)]
        for b in ids:
            self.refcount[b] = 1

    def register(self, block: int, prefix: tuple[int, ...]) -> bool:
        if prefix in self.block_of:
            return False
        self.prefix_of[block], self.block_of[prefix] = prefix, block
        return True

    def free(self, blocks: list[int]) -> None:
        for b in blocks:
            self.refcount[b] -= 1
            if not self.refcount[b]:
                del self.refcount[b]
                if b in self.prefix_of:
                    self.lru.append(b)


def admit(pool: CachingBlockPool, model: Model, holders: list[Holder], rng: random.Random) -> None:
    """A new request: take its cached leading blocks, allocate the rest, register the full."""
    tokens = rng.choice(BASES) + [rng.randrange(3) for _ in range(rng.randint(1, 6))]
    keys = prefix_keys(tokens, BLOCK_SIZE)
    hits = pool.lookup(keys)
    assert hits == model.expected_hits(tokens)
    model.hits += len(hits)
    pool.take(hits)
    model.take(hits)
    needed = blocks_for_length(len(tokens), BLOCK_SIZE) - len(hits)
    if needed > model.num_truly_free() + len(model.lru):
        before = snapshot(pool)
        with pytest.raises(ValueError):
            pool.allocate(needed)
        assert snapshot(pool) == before
        pool.free(hits)
        model.free(hits)
        return
    fresh = pool.allocate(needed)
    model.allocated(fresh)
    blocks = hits + fresh
    for i in range(len(hits), len(keys)):
        prefix = tuple(tokens[: (i + 1) * BLOCK_SIZE])
        assert pool.register(blocks[i], keys[i]) == model.register(blocks[i], prefix)
    holders.append(Holder(tokens, blocks))


def grow(pool: CachingBlockPool, model: Model, holder: Holder, rng: random.Random) -> None:
    """A decode step: one more token, a new block at a boundary, a key when a block fills."""
    if len(holder.tokens) == len(holder.blocks) * BLOCK_SIZE:
        if not pool.can_allocate(1):
            assert model.num_truly_free() + len(model.lru) == 0
            return
        block = pool.allocate(1)
        model.allocated(block)
        holder.blocks += block
    holder.tokens.append(rng.randrange(3))
    if len(holder.tokens) % BLOCK_SIZE == 0:
        key = prefix_keys(holder.tokens, BLOCK_SIZE)[-1]
        block = holder.blocks[-1]
        assert pool.register(block, key) == model.register(block, tuple(holder.tokens))


def refuse_a_bad_call(pool: CachingBlockPool, model: Model, rng: random.Random) -> None:
    """A double free, a take of an uncached block or a second registration: all refused."""
    before = snapshot(pool)
    block = rng.randrange(NUM_BLOCKS)
    with pytest.raises(ValueError):
        if block in model.prefix_of and block in model.refcount:
            pool.register(block, prefix_keys([9, 9], BLOCK_SIZE)[0])
        elif block not in model.prefix_of:
            pool.take([block])
        else:
            pool.free([block] * (model.refcount.get(block, 0) + 1))
    assert snapshot(pool) == before


def check(pool: CachingBlockPool, model: Model, holders: list[Holder]) -> None:
    pool.check_integrity()
    pool.check_refcounts([h.blocks for h in holders])
    assert [pool.refcount(b) for b in range(NUM_BLOCKS)] == [
        model.refcount.get(b, 0) for b in range(NUM_BLOCKS)
    ]
    for b in range(NUM_BLOCKS):
        key = pool.key_of(b)
        assert (key is None) == (b not in model.prefix_of)
        if key is not None:
            assert key == prefix_keys(list(model.prefix_of[b]), BLOCK_SIZE)[-1]
    assert pool.num_free == NUM_BLOCKS - len(model.refcount)
    assert num_evictable(pool) == len(model.lru)


@pytest.mark.parametrize("seed", range(5))
def test_random_operations_keep_the_pool_consistent_with_a_model(seed: int) -> None:
    rng = random.Random(seed)
    pool, model, holders = CachingBlockPool(NUM_BLOCKS), Model(), []
    for _ in range(1500):
        op = rng.random()
        if op < 0.3 or not holders:
            admit(pool, model, holders, rng)
        elif op < 0.6:
            grow(pool, model, rng.choice(holders), rng)
        elif op < 0.9:
            holder = holders.pop(rng.randrange(len(holders)))
            pool.free(holder.blocks[::-1])
            model.free(holder.blocks[::-1])
        else:
            refuse_a_bad_call(pool, model, rng)
        check(pool, model, holders)
    assert pool.evictions > 0 and model.hits > 0  # the run reached both paths it exists to test
