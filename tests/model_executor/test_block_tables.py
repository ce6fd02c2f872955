"""BlockTableRows: a step's block table gathered from rows kept between steps equals the tables padded with 0 to a
width that is a multiple of 16."""

from __future__ import annotations

from dataclasses import dataclass

from attnserve.model_executor.block_tables import WIDTH_MULTIPLE, BlockTableRows, table_width


@dataclass
class _Req:
    request_id: str
    block_table: list[int]


def _padded(tables: list[list[int]]) -> list[list[int]]:
    """The tables padded with 0 to the longest one's length rounded up to 16 (``WIDTH_MULTIPLE``)."""
    width = -(-max(map(len, tables)) // WIDTH_MULTIPLE) * WIDTH_MULTIPLE
    return [t + [0] * (width - len(t)) for t in tables]


def test_rows_follow_growing_replaced_and_released_tables():
    rows = BlockTableRows(rows=2, width=2)
    long = list(range(100, 117))  # 17 entries: wider than the rows (16 after rounding): they widen
    a, b = _Req("a", [5]), _Req("b", [7, 8, 9])
    assert rows.gather([a, b]).tolist() == _padded([[5], [7, 8, 9]])
    a.block_table.append(6)  # grown in place: only the new entry is copied
    assert rows.gather([b, a]).tolist() == _padded([[7, 8, 9], [5, 6]])
    a.block_table = [3]  # a new list (preempted and re-admitted): the row is written anew, its tail zeroed
    assert rows.gather([a]).tolist() == _padded([[3]])
    assert rows.gather([a, b]).tolist() == _padded([[3], [7, 8, 9]])
    rows.release(["b"])
    c, d = _Req("c", [1]), _Req("d", long)  # c takes b's row (zeroed); d makes the rows grow in both ways
    got = rows.gather([c, d, a])
    assert got.shape == (3, 32) and got.tolist() == _padded([[1], long, [3]])


def test_widths_are_multiples_of_16():
    """Triton specializes integer arguments on divisibility by 16 and on 1: the row stride stays one kind."""
    rows = BlockTableRows(rows=4, width=64)
    for n in (1, 15, 16, 17, 64, 65, 200):
        assert rows.gather([_Req(f"r{n}", list(range(n)))]).shape[1] == -(-n // 16) * 16


def test_a_gathered_table_is_not_changed_by_later_steps():
    rows = BlockTableRows()
    a = _Req("a", [1, 2])
    first = rows.gather([a])
    a.block_table.append(3)
    rows.gather([a])
    assert first.tolist() == _padded([[1, 2]])


def test_table_width_holds_every_gathered_width():
    """The CUDA graphs' static table is ``table_width(ceil(max_model_len / block_size))`` wide: every step's
    table, up to a request of ``max_model_len`` tokens, fits it (a 400-token limit at 16-token blocks: 25 blocks,
    a step's table 32 wide past 256 tokens; a 25-wide static table sent those steps to eager)."""
    for max_blocks in (1, 15, 16, 17, 25, 144, 257):
        rows = BlockTableRows(rows=1, width=1)
        assert rows.gather([_Req("a", list(range(max_blocks)))]).shape[1] == table_width(max_blocks)
    assert table_width(25) == 32 and table_width(144) == 144
