"""BlockManager: the paged KV cache's bookkeeping (free list, per-request block tables). No torch.

Physical block ``b`` holds the K/V of ``block_size`` consecutive token positions of one request; the slot
of position ``p`` is ``table[p // block_size] * block_size + p % block_size``.
"""

from __future__ import annotations

from collections import deque


class BlockManager:
    """Allocates fixed-size KV-cache blocks to requests from a free list."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks {num_blocks} and block_size {block_size} must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_blocks: deque[int] = deque(range(num_blocks))
        self.block_tables: dict[str, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, 0.0 to 1.0."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return (num_tokens + self.block_size - 1) // self.block_size

    def allocate(self, request_id: str, num_tokens: int) -> bool:
        """Grow ``request_id``'s table to hold ``num_tokens`` positions. False (nothing taken) if too few free."""
        table = self.block_tables.setdefault(request_id, [])
        extra = (num_tokens + self.block_size - 1) // self.block_size - len(table)
        if extra <= 0:  # most decode steps: the last block still has room
            return True
        if extra > len(self.free_blocks):
            if not table:
                del self.block_tables[request_id]
            return False
        table.extend(self.free_blocks.popleft() for _ in range(extra))
        return True

    def free(self, request_id: str) -> None:
        """Return all of ``request_id``'s blocks to the free list (no-op for an unknown id)."""
        self.free_blocks.extend(self.block_tables.pop(request_id, []))

    def slot(self, request_id: str, position: int) -> int:
        """Flat cache slot of ``position`` in ``request_id``'s sequence."""
        return self.block_tables[request_id][position // self.block_size] * self.block_size + position % self.block_size
