"""Block hashes for prefix caching: a full KV block's key, chained over its parent block's. No torch.

Block i's hash covers block i-1's hash, its own token ids and any extra key that changes its K/V (none today;
a LoRA id or a multimodal input would join here), so equal hashes mean equal K/V for the whole prefix up to
the block's end. sha256 of a canonical byte encoding, as vLLM's default: a collision would hand one request
another's K/V without a sign, so the hash must be cryptographic.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Callable, Sequence

import numpy as np

BlockHash = bytes  # 32 bytes

# the parent hash of a sequence's first block
ROOT_HASH: BlockHash = hashlib.sha256(b"attnserve prefix cache v1").digest()

assert array("q").itemsize == 8 and sys.byteorder == "little"  # the encoding below: int64, little-endian


def _digest(parent: BlockHash, encoded_tokens: bytes, extra_key: bytes = b"") -> BlockHash:
    h = hashlib.sha256(parent)
    h.update(encoded_tokens)
    if extra_key:
        h.update(extra_key)
    return h.digest()


def hash_block_tokens(parent: BlockHash, token_ids: Sequence[int], extra_key: bytes = b"") -> BlockHash:
    """sha256 over ``parent`` (32 bytes), the token count (int64), the token ids (int64 each) and ``extra_key``.

    The count keeps the encoding prefix-free between the token ids and the extra key."""
    return _digest(parent, array("q", (len(token_ids), *token_ids)).tobytes(), extra_key)


def extend_block_hashes(
    hashes: list[BlockHash], num_tokens: int, token_slice: Callable[[int, int], list[int]], block_size: int
) -> list[BlockHash]:
    """Append to ``hashes`` the hashes of the full blocks among the first ``num_tokens`` tokens that it lacks
    (``token_slice(start, end)``: the sequence's tokens ``[start, end)``); returns ``hashes``. O(new blocks): the
    new blocks are encoded at once (each row: the count, then the block's token ids, :func:`hash_block_tokens`'s
    encoding), then each block hashes its row in place (a memoryview slice: no copy, no per-block list)."""
    first, end = len(hashes), num_tokens // block_size
    if end > first:
        tokens = np.asarray(token_slice(first * block_size, end * block_size), dtype=np.int64)
        _hash_rows(hashes, tokens, block_size)
    return hashes


def _hash_rows(hashes: list[BlockHash], tokens: np.ndarray, block_size: int) -> None:
    """Append the chained hashes of ``tokens`` (int64, a whole number of blocks, following ``hashes``' blocks)."""
    n = len(tokens) // block_size
    rows = np.empty((n, block_size + 1), dtype=np.int64)
    rows[:, 0] = block_size
    rows[:, 1:] = tokens.reshape(n, block_size)
    data = memoryview(rows.tobytes())  # little-endian int64: asserted above
    step = 8 * (block_size + 1)
    parent = hashes[-1] if hashes else ROOT_HASH
    sha256, append = hashlib.sha256, hashes.append
    for start in range(0, n * step, step):
        h = sha256(parent)
        h.update(data[start : start + step])
        parent = h.digest()
        append(parent)


class PromptHashMemo:
    """The full blocks' token ids and hashes of the last prompt hashed. A prompt whose first full blocks hold the
    same token ids takes those blocks' hashes from it instead of hashing them again: a block's chained hash is a
    function of the token ids from the sequence's start to the block's end (and its extra key: none yet), so the
    reuse is exact, never a guess. A batch of prompts behind one system prompt hashes that prefix once, not once
    per prompt (about half a microsecond a block, on the scheduling path)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.tokens: list[int] = []
        self.hashes: list[BlockHash] = []

    def prompt_hashes(self, prompt_token_ids: Sequence[int]) -> list[BlockHash]:
        """The hashes of ``prompt_token_ids``' full blocks (a new list); remembers this prompt for the next."""
        bs = self.block_size
        tokens = list(prompt_token_ids[: len(prompt_token_ids) // bs * bs])
        same = _common_blocks(tokens, self.tokens, bs)
        hashes = self.hashes[:same]
        if len(tokens) > same * bs:
            _hash_rows(hashes, np.asarray(tokens[same * bs :], dtype=np.int64), bs)
        self.tokens, self.hashes = tokens, hashes
        return list(hashes)


def _common_blocks(a: list[int], b: list[int], block_size: int) -> int:
    """How many leading blocks of ``block_size`` token ids ``a`` and ``b`` share: list comparisons run in C, by
    bisection (a prompt behind a shared prefix compares about log2(blocks) slices)."""
    n = min(len(a), len(b)) // block_size
    if a[: n * block_size] == b[: n * block_size]:
        return n
    lo, hi = 0, n  # a and b agree on lo blocks and differ within the first hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo * block_size : mid * block_size] == b[lo * block_size : mid * block_size]:
            lo = mid
        else:
            hi = mid
    return lo
