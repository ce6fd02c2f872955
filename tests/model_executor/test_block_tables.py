"""BlockTableRows: a step's block table gathered from rows kept between steps equals the tables padded with 0."""

from __future__ import annotations

from dataclasses import dataclass

from attnserve.model_executor.block_tables import BlockTableRows


@dataclass
class _Req:
    request_id: str
    block_table: list[int]


def test_rows_follow_growing_replaced_and_released_tables():
    rows = BlockTableRows(rows=2, width=2)
    a, b = _Req("a", [5]), _Req("b", [7, 8, 9])  # b is wider than the rows: they widen
    assert rows.gather([a, b]).tolist() == [[5, 0, 0], [7, 8, 9]]
    a.block_table.append(6)  # grown in place: only the new entry is copied
    assert rows.gather([b, a]).tolist() == [[7, 8, 9], [5, 6, 0]]
    a.block_table = [3]  # a new list (preempted and re-admitted): the row is written anew, its tail zeroed
    assert rows.gather([a]).tolist() == [[3]]
    assert rows.gather([a, b]).tolist() == [[3, 0, 0], [7, 8, 9]]
    rows.release(["b"])
    c, d = _Req("c", [1]), _Req("d", [2, 4])  # c takes b's row (zeroed); d makes the rows grow
    assert rows.gather([c, d, a]).tolist() == [[1, 0], [2, 4], [3, 0]]


def test_a_gathered_table_is_not_changed_by_later_steps():
    rows = BlockTableRows()
    a = _Req("a", [1, 2])
    first = rows.gather([a])
    a.block_table.append(3)
    rows.gather([a])
    assert first.tolist() == [[1, 2]]
