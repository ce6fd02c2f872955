"""BlockManager: the paged KV cache's blocks, per-request block tables and the prefix cache. No torch.

Physical block ``b`` holds the K/V of ``block_size`` consecutive token positions; the slot of position ``p``
of a request is ``table[p // block_size] * block_size + p % block_size``.

Prefix caching (vLLM v1's ``KVCacheManager`` and ``BlockPool``; nano-vllm's ``BlockManager`` is the short
version): a block full of known tokens is registered under its chained hash (``block_hash.py``) when the step
that computes it is scheduled, and a later request whose leading block hashes match takes those blocks into
its table instead of computing them. Registering at scheduling time is safe: steps run in order on the
device, and within a step every layer writes the whole batch's K/V before it attends, so even a request
admitted in the same step reads K/V that is written by then.

- A block's reference count is the number of tables that hold it; a block with none is free.
- Free blocks wait in one queue in eviction order. Allocation takes from its front; a freed block without a
  hash goes to the front (nothing is lost by reusing it), a freed hashed block to the back, a table's last
  block first, so that a sequence's prefix outlives its tail (least recently used first, as vLLM). Taking a
  hashed block from the queue evicts its hash. A block in use is never in the queue, so never evicted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from attnserve.engine.block_hash import BlockHash


class BlockManager:
    """Allocates fixed-size KV-cache blocks to requests; with ``enable_prefix_caching`` reuses hashed full blocks."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks {num_blocks} and block_size {block_size} must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.ref_counts = [0] * num_blocks
        self.block_tables: dict[str, list[int]] = {}
        self.block_hashes: list[BlockHash | None] = [None] * num_blocks  # the hash each block is cached under
        self.cached: dict[BlockHash, int] = {}  # hash -> the block holding that prefix's K/V
        # per request: how many leading blocks of its table were offered to the cache (registered, or duplicates)
        self.num_registered: dict[str, int] = {}

    @property
    def num_free_blocks(self) -> int:
        """Blocks no request holds (cached ones included: allocation may evict them)."""
        return len(self.free_queue)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks holding a registered prefix, in use or free."""
        return len(self.cached)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, 0.0 to 1.0."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return (num_tokens + self.block_size - 1) // self.block_size

    def lookup(self, block_hashes: Sequence[BlockHash], max_blocks: int) -> list[int]:
        """The cached blocks of the longest run of leading ``block_hashes`` (at most ``max_blocks``). Takes
        nothing: :meth:`allocate` with them does. Empty when prefix caching is off."""
        if not self.enable_prefix_caching:
            return []
        blocks = list(map(self.cached.get, block_hashes[:max_blocks]))  # one pass in C, then cut at the first miss
        if None in blocks:
            del blocks[blocks.index(None) :]
        return blocks

    def allocate(self, request_id: str, num_tokens: int, cached_blocks: Sequence[int] = ()) -> bool:
        """Grow ``request_id``'s table to hold ``num_tokens`` positions, a new table starting with
        ``cached_blocks`` (from :meth:`lookup`). False, and nothing taken, if too few blocks are free."""
        table = self.block_tables.get(request_id)
        assert table is None or not cached_blocks, "cached blocks start a new table only"
        table = [] if table is None else table
        extra = self.blocks_needed(num_tokens) - len(table) - len(cached_blocks)
        if extra <= 0 and not cached_blocks:  # most decode steps: the last block still has room
            self.block_tables[request_id] = table
            return True
        # a cached block that no one holds is in the free queue: taking it leaves one free block fewer
        reused_free = sum(1 for b in cached_blocks if self.ref_counts[b] == 0)
        if extra > len(self.free_queue) - reused_free:
            return False
        for b in cached_blocks:
            if self.ref_counts[b] == 0:
                del self.free_queue[b]
            self.ref_counts[b] += 1
        table.extend(cached_blocks)
        for _ in range(extra):
            table.append(self._take_free())
        self.block_tables[request_id] = table
        if cached_blocks:
            self.num_registered[request_id] = len(cached_blocks)
        return True

    def _take_free(self) -> int:
        block, _ = self.free_queue.popitem(last=False)
        h = self.block_hashes[block]
        if h is not None:  # evict: its prefix is no longer cached
            self.block_hashes[block] = None
            if self.cached.get(h) == block:
                del self.cached[h]
        self.ref_counts[block] = 1
        return block

    def cache_blocks(self, request_id: str, block_hashes: Sequence[BlockHash], num_full_blocks: int) -> None:
        """Register the first ``num_full_blocks`` blocks of ``request_id``'s table under ``block_hashes`` (those
        blocks' K/V is computed by the step being scheduled or earlier). A hash already cached keeps its block:
        the duplicate stays unregistered and is reused like any block without a hash. No-op when caching is off."""
        if not self.enable_prefix_caching:
            return
        start = self.num_registered.get(request_id, 0)
        if num_full_blocks <= start:
            return
        table = self.block_tables[request_id]
        for i in range(start, num_full_blocks):
            h, b = block_hashes[i], table[i]
            if self.block_hashes[b] is None and h not in self.cached:
                self.block_hashes[b] = h
                self.cached[h] = b
        self.num_registered[request_id] = num_full_blocks

    def free(self, request_id: str) -> None:
        """Release ``request_id``'s blocks (no-op for an unknown id): each block no other table holds goes to
        the free queue, hashed ones (still cached) at the back, last block first."""
        self.num_registered.pop(request_id, None)
        for b in reversed(self.block_tables.pop(request_id, [])):
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free_queue[b] = None
                if self.block_hashes[b] is None:
                    self.free_queue.move_to_end(b, last=False)

    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix (blocks in use stay with their requests); returns how many were cached."""
        n = len(self.cached)
        self.cached.clear()
        self.block_hashes = [None] * self.num_blocks
        return n

    def slot(self, request_id: str, position: int) -> int:
        """Flat cache slot of ``position`` in ``request_id``'s sequence."""
        return self.block_tables[request_id][position // self.block_size] * self.block_size + position % self.block_size
