"""How heads and vocabularies split over ranks: plain arithmetic, no processes."""

from __future__ import annotations

import pytest

from attnserve.distributed.sharding import HeadShard, shard_heads, shard_range, shard_vocab


def test_shard_range_covers_everything_once_first_ranks_larger():
    for total, size in [(10, 3), (1536, 2), (3, 2), (7, 7)]:
        parts = [shard_range(total, size, r) for r in range(size)]
        assert parts[0][0] == 0 and sum(n for _, n in parts) == total
        assert all(a + n == b for (a, n), (b, _) in zip(parts, parts[1:]))
        assert max(n for _, n in parts) - min(n for _, n in parts) <= 1


@pytest.mark.parametrize(
    "heads, kv, size, expected",
    [
        (4, 2, 2, [HeadShard(0, 2, 0, 1), HeadShard(2, 2, 1, 1)]),
        # the default model (SmolLM2-135M): 9 query heads over 3 KV heads on 2 ranks -> 2 + 1 KV groups
        (9, 3, 2, [HeadShard(0, 6, 0, 2), HeadShard(6, 3, 2, 1)]),
        # fewer KV heads than ranks: each KV head replicated, its query heads split
        (8, 2, 4, [HeadShard(0, 2, 0, 1), HeadShard(2, 2, 0, 1), HeadShard(4, 2, 1, 1), HeadShard(6, 2, 1, 1)]),
        (8, 1, 2, [HeadShard(0, 4, 0, 1), HeadShard(4, 4, 0, 1)]),
        (4, 4, 1, [HeadShard(0, 4, 0, 4)]),
    ],
)
def test_shard_heads(heads, kv, size, expected):
    shards = [shard_heads(heads, kv, size, r) for r in range(size)]
    assert shards == expected
    for s in shards:  # every query head's KV head is on its rank
        group = heads // kv
        assert all(
            s.kv_start <= q // group < s.kv_start + s.num_kv_heads for q in range(s.q_start, s.q_start + s.num_heads)
        )


def test_unsplittable_heads_name_the_sizes():
    with pytest.raises(ValueError, match="tensor_parallel_size 4 cannot split 6 query heads over 2 KV heads"):
        shard_heads(6, 2, 4, 0)


def test_vocab_rows_padded_alike_on_every_rank():
    shards = [shard_vocab(49155, 2, r) for r in range(2)]
    assert [(s.start, s.end, s.rows) for s in shards] == [(0, 24578, 24578), (24578, 49155, 24578)]
