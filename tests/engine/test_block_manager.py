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


# --- prefix caching ---------------------------------------------------------------------------------------

from attnserve.engine.block_hash import (  # noqa: E402
    ROOT_HASH,
    PromptHashMemo,
    extend_block_hashes,
    hash_block_tokens,
)


def hashes(tokens: list[int], block_size: int = 4) -> list[bytes]:
    return extend_block_hashes([], len(tokens), lambda a, b: tokens[a:b], block_size)


def cached_bm(num_blocks: int = 8, block_size: int = 4) -> BlockManager:
    return BlockManager(num_blocks, block_size, enable_prefix_caching=True)


def test_block_hash_is_sha256_chained_over_parent_and_tokens():
    import hashlib
    import struct

    expected = hashlib.sha256(ROOT_HASH + struct.pack("<5q", 4, 1, 2, 3, 4)).digest()
    assert hash_block_tokens(ROOT_HASH, [1, 2, 3, 4]) == expected
    h = hashes([1, 2, 3, 4, 5, 6, 7, 8, 9])  # two full blocks; the 9th token is not hashed
    assert h == [expected, hash_block_tokens(expected, [5, 6, 7, 8])]
    # the same tokens after another parent hash to something else
    assert hashes([0, 0, 0, 0, 5, 6, 7, 8])[1] != h[1]
    assert hash_block_tokens(ROOT_HASH, [1, 2, 3, 4], b"lora 1") != expected


def test_extending_hashes_equals_hashing_each_block_in_turn():
    tokens = [(i * 7919) % 151936 for i in range(16 * 9 + 5)]
    whole = extend_block_hashes([], len(tokens), lambda a, b: tokens[a:b], 16)
    parent, expected = ROOT_HASH, []
    for i in range(9):
        parent = hash_block_tokens(parent, tokens[16 * i : 16 * (i + 1)])
        expected.append(parent)
    assert whole == expected
    assert extend_block_hashes(expected[:4], len(tokens), lambda a, b: tokens[a:b], 16) == expected


def test_prompt_hash_memo_gives_the_hashes_of_hashing_each_prompt_alone():
    base = [(i * 7919) % 151936 for i in range(16 * 9 + 5)]
    prompts = [
        base,  # first: nothing remembered
        base,  # an exact repeat
        base[:50] + [7] + base[51:],  # differs inside block 3
        [1] + base[1:],  # differs in the first token: no block shared
        base[:20],  # shorter than the one remembered, sharing its first block
        base + [3] * 40,  # longer: the remembered blocks, then new ones
        base[:15],  # no full block
    ]
    memo = PromptHashMemo(16)
    for prompt in prompts:
        got = memo.prompt_hashes(prompt)
        assert got == hashes(prompt, 16)
        assert memo.hashes == got and got is not memo.hashes  # the caller's list is its own


def test_a_second_request_reuses_the_full_blocks_of_a_shared_prefix():
    bm = cached_bm()
    a = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert bm.lookup(hashes(a), 2) == []
    assert bm.allocate("a", 10)
    bm.cache_blocks("a", hashes(a), 2)
    b = a[:6] + [60, 61, 62, 63]  # the common prefix ends inside the second block
    hit = bm.lookup(hashes(b), 2)
    assert hit == bm.block_tables["a"][:1]
    assert bm.allocate("b", 10, hit)
    assert bm.block_tables["b"][0] == bm.block_tables["a"][0]
    assert bm.ref_counts[bm.block_tables["a"][0]] == 2
    assert set(bm.block_tables["b"][1:]).isdisjoint(bm.block_tables["a"])
    assert bm.num_free_blocks == 8 - 5


def test_prompts_that_differ_in_one_token_of_the_first_block_share_no_block():
    bm = cached_bm()
    a = list(range(1, 13))
    bm.allocate("a", 12)
    bm.cache_blocks("a", hashes(a), 3)
    b = [1, 2, 99, 4] + a[4:]  # blocks 2 and 3 hold the same tokens, after another first block
    assert bm.lookup(hashes(b), 3) == []


def test_freed_cached_blocks_stay_reusable_until_evicted_least_recently_used_first():
    bm = cached_bm(num_blocks=6)
    a, b = list(range(1, 9)), list(range(11, 19))
    for rid, toks in (("a", a), ("b", b)):
        bm.allocate(rid, 8)
        bm.cache_blocks(rid, hashes(toks), 2)
    table_a, table_b = list(bm.block_tables["a"]), list(bm.block_tables["b"])
    bm.free("a")
    bm.free("b")  # a was used less recently than b
    assert bm.num_free_blocks == 6 and bm.num_cached_blocks == 4
    assert bm.lookup(hashes(a), 2) == table_a
    # 3 blocks: the 2 never-cached free blocks first, then a's last block (a's prefix outlives its tail)
    bm.allocate("c", 12)
    assert bm.lookup(hashes(a), 2) == table_a[:1]
    assert bm.lookup(hashes(b), 2) == table_b
    bm.allocate("d", 4)  # then a's first block
    assert bm.lookup(hashes(a), 2) == []
    assert bm.lookup(hashes(b), 2) == table_b


def test_a_block_in_use_is_never_evicted():
    bm = cached_bm(num_blocks=4)
    a = list(range(1, 9))
    bm.allocate("a", 8)
    bm.cache_blocks("a", hashes(a), 2)
    assert bm.allocate("x", 8)  # takes the two other blocks
    assert not bm.allocate("y", 4)  # nothing free: a's cached blocks are in use
    assert bm.lookup(hashes(a), 2) == bm.block_tables["a"]


def test_taking_a_free_cached_block_counts_against_the_free_blocks():
    bm = cached_bm(num_blocks=3)
    a = list(range(1, 9))
    bm.allocate("a", 8)
    bm.cache_blocks("a", hashes(a), 2)
    bm.free("a")
    hit = bm.lookup(hashes(a + [9]), 2)
    assert len(hit) == 2
    assert not bm.allocate("b", 16, hit)  # 2 reused + 2 new > 3 blocks: nothing taken
    assert bm.num_free_blocks == 3 and "b" not in bm.block_tables
    assert bm.allocate("b", 12, hit)  # 2 reused + 1 new
    assert bm.num_free_blocks == 0


def test_every_block_is_free_or_cached_when_all_requests_end():
    bm = cached_bm(num_blocks=8)
    shared = list(range(1, 9))
    for i in range(3):
        toks = shared + [100 + i] * 4
        h = hashes(toks)
        hit = bm.lookup(h, 2)
        assert bm.allocate(str(i), 12, hit)
        bm.cache_blocks(str(i), h, 3)
    assert bm.ref_counts[bm.block_tables["0"][0]] == 3
    for i in range(3):
        bm.free(str(i))
    assert bm.num_free_blocks == 8 and set(bm.ref_counts) == {0}
    assert bm.num_cached_blocks == 2 + 3  # the shared prefix once, each request's own last block


def test_a_duplicate_block_keeps_the_first_one_cached():
    bm = cached_bm()
    a = list(range(1, 9))
    for rid in ("a", "b"):  # same tokens computed twice (both admitted before either was cached)
        bm.allocate(rid, 8)
        bm.cache_blocks(rid, hashes(a), 2)
    assert bm.lookup(hashes(a), 2) == bm.block_tables["a"]
    table_b = bm.block_tables["b"]
    bm.free("b")  # b's blocks have no hash: next to be reused, in table order
    assert list(bm.free_queue)[:2] == table_b
    assert bm.num_cached_blocks == 2


def test_reset_prefix_cache_forgets_every_prefix_and_keeps_tables():
    bm = cached_bm()
    a = list(range(1, 9))
    bm.allocate("a", 8)
    bm.cache_blocks("a", hashes(a), 2)
    assert bm.reset_prefix_cache() == 2
    assert bm.lookup(hashes(a), 2) == [] and len(bm.block_tables["a"]) == 2


def test_caching_off_looks_nothing_up_and_registers_nothing():
    bm = BlockManager(8, 4)
    a = list(range(1, 9))
    bm.allocate("a", 8)
    bm.cache_blocks("a", hashes(a), 2)
    assert bm.num_cached_blocks == 0 and bm.lookup(hashes(a), 2) == []
