"""BlockTableRows: the running requests' block tables as rows of one numpy array, kept between steps.

A step's block table (B, W) is then one gather of its requests' rows; a request's row takes only the entries
its table gained since the step before (a decode gains one block in ``block_size`` steps), not its whole table
each step. The scheduler's tables only grow in place, or are replaced by a new list (a preempted request's,
re-admitted): a row follows its list by identity and count, and is written anew for a new list.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

# a step's table width W is rounded up to a multiple of this: Triton specializes a kernel's integer arguments on
# divisibility by 16 (and on 1), so a width that varied in kind from step to step (the table's row stride) would
# compile the attention kernels again inside a run; padding entries are 0, never read (past each sequence's end)
WIDTH_MULTIPLE = 16


class BlockTableRows:
    """Rows of int32 block ids, one per request id, 0 past each table's end."""

    def __init__(self, rows: int = 64, width: int = 64) -> None:
        self._rows = np.zeros((rows, table_width(width)), dtype=np.int32)
        # request id -> [its table (the scheduler's list), row, entries copied]
        self._entries: dict[str, list] = {}
        self._free: list[int] = list(range(rows - 1, -1, -1))

    def gather(self, reqs: Sequence) -> np.ndarray:
        """(len(reqs), W) int32: row i = ``reqs[i].block_table`` padded with 0 to W, the longest table's length
        rounded up to ``WIDTH_MULTIPLE`` (a new array: later calls do not change it). ``reqs``: objects with
        ``request_id`` and ``block_table``."""
        n = len(reqs)
        index = np.empty(n, dtype=np.int64)
        entries = self._entries
        width = 0
        for i, r in enumerate(reqs):
            table = r.block_table
            count = len(table)
            e = entries.get(r.request_id)
            if e is None or e[0] is not table:
                e = self._assign(r.request_id, table, e)
            if e[2] != count:
                self._write(e, count)
            index[i] = e[1]
            if count > width:
                width = count
        return self._rows[index, : table_width(width)]

    def release(self, request_ids: Iterable[str]) -> None:
        """Free the rows of requests that finished."""
        for rid in request_ids:
            e = self._entries.pop(rid, None)
            if e is not None:
                self._free.append(e[1])

    def _assign(self, request_id: str, table: list[int], old: list | None) -> list:
        """A row for a request's new table list (its old row, zeroed, when it had one)."""
        if old is not None:
            row = old[1]
            self._rows[row] = 0
        else:
            if not self._free:
                grown = self._rows.shape[0]
                self._rows = np.concatenate([self._rows, np.zeros_like(self._rows)])
                self._free.extend(range(2 * grown - 1, grown - 1, -1))
            row = self._free.pop()
            self._rows[row] = 0  # a finished request's entries may be left in it
        e = self._entries[request_id] = [table, row, 0]
        return e

    def _write(self, e: list, count: int) -> None:
        table, row, done = e
        if count > self._rows.shape[1]:
            width = table_width(max(count, 2 * self._rows.shape[1]))
            rows = np.zeros((self._rows.shape[0], width), dtype=np.int32)
            rows[:, : self._rows.shape[1]] = self._rows
            self._rows = rows
        if count > done:
            self._rows[row, done:count] = table[done:count]
        else:  # shorter than copied (not done by the scheduler; kept correct anyway)
            self._rows[row, count:done] = 0
        e[2] = count


def table_width(width: int) -> int:
    """``width`` rounded up to a multiple of ``WIDTH_MULTIPLE``: the width of a step's table whose longest row
    holds ``width`` blocks (the rows' capacity is rounded too, so a step's width always fits; so is the CUDA
    graphs' static table, or a step wider than ``ceil(max_model_len / block_size)`` could not replay)."""
    return -(-width // WIDTH_MULTIPLE) * WIDTH_MULTIPLE
