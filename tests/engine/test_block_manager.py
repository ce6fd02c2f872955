"""BlockManager with plain data: allocation, growth, exhaustion, free, slots."""

import pytest

from attnserve.engine.block_manager import BlockManager


def test_allocate_grows_by_whole_blocks_and_frees_everything():
    bm = BlockManager(num_blocks=4, block_size=4)
    assert bm.allocate("a", 5)  # 2 blocks
    assert bm.block_tables["a"] == [0, 1]
    assert bm.allocate("a", 8)  # still 2 blocks
    assert bm.block_tables["a"] == [0, 1]
    assert bm.allocate("a", 9)
    assert bm.block_tables["a"] == [0, 1, 2]
    assert bm.num_free_blocks == 1
    assert not bm.allocate("b", 5)  # needs 2, 1 free: nothing taken, no table left behind
    assert "b" not in bm.block_tables and bm.num_free_blocks == 1
    bm.free("a")
    assert bm.num_free_blocks == 4 and bm.usage == 0.0


def test_slot_of_a_position():
    bm = BlockManager(num_blocks=8, block_size=4)
    bm.allocate("x", 3)
    bm.allocate("y", 10)  # blocks 1, 2, 3
    assert bm.slot("y", 0) == 4
    assert bm.slot("y", 9) == 3 * 4 + 1


def test_bad_sizes_rejected():
    with pytest.raises(ValueError, match="num_blocks 0"):
        BlockManager(0, 16)
