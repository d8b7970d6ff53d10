"""What the prefix-cache tests count in a `CachingBlockPool`, read through its public methods."""

from __future__ import annotations

from llmengine.kv.prefix_cache import CachingBlockPool


def num_keyed(pool: CachingBlockPool) -> int:
    """Blocks cached under a key, held or evictable."""
    return sum(pool.key_of(b) is not None for b in range(pool.num_blocks))


def num_evictable(pool: CachingBlockPool) -> int:
    """Cached blocks nobody holds: `take` can still reuse them until `allocate` evicts them."""
    return sum(pool.key_of(b) is not None and pool.refcount(b) == 0 for b in range(pool.num_blocks))
