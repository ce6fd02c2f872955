"""Reading a prompts file (generate --prompts-file, bench throughput --prompts-file, bench serve --prompt-file)."""

from __future__ import annotations

import pytest

from attnserve.benchmarks.requests import PROMPT_LINE, PromptsFileError, numbered_lines, read_prompts_file, text_lines


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
    path.write_text('{"prompt": "x"}\nplain\n  {"prompt": "y", "id": 3}\n[1, 2]\n')
    assert read_prompts_file(str(path)) == ["x", "plain", "y", "[1, 2]"]


def test_numbered_lines_count_blank_lines_too(tmp_path):
    path = tmp_path / "p.txt"
    path.write_bytes(b"a\r\n\n  \r\nb\rc")
    assert numbered_lines(str(path)) == [(1, "a"), (4, "b"), (5, "c")]


@pytest.mark.parametrize(
    "text, message",
    [
        # was a KeyError traceback in bench serve, and the line sent as a text prompt in bench throughput
        ('{"prompt": "a"}\n\n{"text": "b", "id": 3}\n', '{p}:3: missing key "prompt" (its keys: "text", "id")'),
        ("{}\n", '{p}:1: missing key "prompt" (the object is empty)'),
        (
            '{"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6}\n',
            '{p}:1: missing key "prompt" (its keys: "a", "b", "c", "d", "e", ...)',
        ),
        # was "Expecting ',' delimiter: line 1 column 16 (char 15)" in bench serve, naming neither file nor line
        ('plain\n{"prompt": "a" "b"}\n', "{p}:2:16: malformed JSON: Expecting ',' delimiter"),
        ('{"prompt": "a"} trailing\n', "{p}:1:17: malformed JSON: Extra data"),
        ('{"prompt": 5}\n', '{p}:1: "prompt" is 5, not a string'),
        ('{"prompt": null}\n', '{p}:1: "prompt" is null, not a string'),
        ('{"prompt": ["a"]}\n', '{p}:1: "prompt" is ["a"], not a string'),
        ('{"prompt": ""}\n', '{p}:1: "prompt" is empty'),
    ],
)
def test_a_bad_jsonl_line_names_the_file_the_line_and_what_a_line_must_be(tmp_path, text, message):
    path = tmp_path / "p.jsonl"
    path.write_text(text)
    with pytest.raises(PromptsFileError) as e:
        read_prompts_file(str(path))
    assert str(e.value) == message.format(p=path) + "; " + PROMPT_LINE
    assert PROMPT_LINE == 'each line must be a prompt as plain text, or a JSON object with a non-empty "prompt" string'
