"""Reading a prompts file (generate --prompts-file, bench throughput --prompts-file, bench serve --prompt-file)."""

from __future__ import annotations

import pytest

from attnserve.benchmarks.requests import PromptsFileError, read_prompts_file, text_lines


def test_text_lines_end_lines_as_a_text_file_does_and_skip_blank_ones(tmp_path):
    path = tmp_path / "p.txt"
    path.write_bytes("a\r\nb\rcafé \u2028x\n\n  \nlast".encode())
    assert text_lines(str(path)) == ["a", "b", "café \u2028x", "last"]
    assert text_lines(str(path)) == [line.rstrip("\n") for line in open(path, encoding="utf-8") if line.strip()]


def test_bytes_that_are_not_utf8_are_named_with_their_offset_in_the_file(tmp_path):
    path = tmp_path / "p.txt"
    path.write_bytes("café\n".encode() + b"ok\n\xff\n")  # é is 2 bytes: 0xff is byte 9
    with pytest.raises(PromptsFileError) as e:
        text_lines(str(path))
    assert str(e.value) == f"{path} is not UTF-8 text (byte 0xff at offset 9)"
    with pytest.raises(PromptsFileError):
        read_prompts_file(str(path))


def test_jsonl_lines_give_their_prompt(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "x"}\nplain\n{"other": 1}\n')
    assert read_prompts_file(str(path)) == ["x", "plain", '{"other": 1}']
