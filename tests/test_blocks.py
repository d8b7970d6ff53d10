"""The block pool and block tables: the integer bookkeeping under the paged cache."""

from __future__ import annotations

import pytest

from llmengine.kv.blocks import BlockPool, BlockTable


def test_pool_allocates_and_frees() -> None:
    pool = BlockPool(4)
    ids = pool.allocate(3)
    assert len(set(ids)) == 3 and pool.num_free == 1
    pool.free(ids)
    assert pool.num_free == 4
    pool.check_integrity()


def test_allocating_more_than_is_free_changes_nothing() -> None:
    pool = BlockPool(4)
    held = pool.allocate(2)
    with pytest.raises(ValueError, match="only 2 of 4 free"):
        pool.allocate(3)
    assert pool.num_free == 2 and pool.held_ids == frozenset(held)


def test_double_free_raises_and_changes_nothing() -> None:
    pool = BlockPool(4)
    ids = pool.allocate(2)
    pool.free(ids[:1])
    with pytest.raises(ValueError, match="double free"):
        pool.free(ids)
    with pytest.raises(ValueError, match="double free"):
        pool.free([ids[1], ids[1]])
    assert pool.num_free == 3
    pool.check_integrity()


def test_freeing_an_id_the_pool_never_handed_out_raises() -> None:
    pool = BlockPool(4)
    with pytest.raises(ValueError, match="never handed out"):
        pool.free([4])
    with pytest.raises(ValueError, match="never handed out"):
        pool.free([-1])


def test_pool_needs_a_block() -> None:
    with pytest.raises(ValueError):
        BlockPool(0)


def test_block_table_maps_positions_to_block_and_offset() -> None:
    table = BlockTable(block_size=4)
    table.extend([7, 2])
    assert [table.location_of(p) for p in (0, 3, 4, 7)] == [(7, 0), (7, 3), (2, 0), (2, 3)]
    with pytest.raises(IndexError):
        table.location_of(8)


def test_block_table_never_allocates_behind_its_owners_back() -> None:
    table = BlockTable(block_size=4)
    table.extend([0])
    table.append(4)
    with pytest.raises(ValueError, match="extend it first"):
        table.append(1)
    assert table.block_ids == [0] and table.num_tokens == 4
    table.extend([1])
    table.append(1)
    assert table.release() == [0, 1] and table.num_tokens == 0
