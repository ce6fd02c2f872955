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
    new tokens are encoded once, then each block hashes its slice of the bytes (:func:`hash_block_tokens`'s
    encoding, without a list and an array per block)."""
    first, end = len(hashes), num_tokens // block_size
    if end <= first:
        return hashes
    data = array("q", token_slice(first * block_size, end * block_size)).tobytes()
    count = array("q", (block_size,)).tobytes()
    step = 8 * block_size
    parent = hashes[-1] if hashes else ROOT_HASH
    for i in range(end - first):
        parent = _digest(parent, count + data[i * step : (i + 1) * step])
        hashes.append(parent)
    return hashes
