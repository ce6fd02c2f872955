"""The requests an offline benchmark sends: random token ids or a prompts file, lengths drawn from a range.

Lengths are uniform integers in ``[floor(L * (1 - R)), floor(L * (1 + R))]`` (at least 1) for ``--range-ratio
R`` (vLLM's random dataset); R = 0 gives exactly L. Everything is drawn from one ``numpy`` generator seeded
with ``--seed``, so the same flags give the same requests.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass

import numpy as np

from attnserve.refusals import Refused
from attnserve.refusals.cli import (  # noqa: F401 (PROMPT_LINE re-exported)
    PROMPT_LINE,
    bad_prompt_line,
    missing_prompt_key,
    not_utf8_file,
    prompt_not_text,
)
from attnserve.refusals.config import NESTED_TOO_DEEPLY, malformed


@dataclass(frozen=True)
class BenchRequest:
    """One request: its prompt token ids and how many tokens it must generate (EOS ignored). In a multi-turn
    workload, ``next_turns`` are the conversation's later turns, each (new message token ids, output length):
    turn k's prompt is turn k-1's prompt, its answer and turn k's message."""

    prompt_token_ids: list[int]
    output_len: int
    next_turns: tuple[tuple[list[int], int], ...] = ()

    @property
    def input_len(self) -> int:
        return len(self.prompt_token_ids)

    def next_turn(self, answer: list[int]) -> BenchRequest | None:
        """The conversation's next request once this one answered ``answer``; None after the last turn."""
        if not self.next_turns:
            return None
        (message, output_len), rest = self.next_turns[0], self.next_turns[1:]
        return BenchRequest(self.prompt_token_ids + answer + message, output_len, rest)

    @property
    def num_turns(self) -> int:
        return 1 + len(self.next_turns)

    @property
    def turn_lens(self) -> list[tuple[int, int]]:
        """(prompt tokens, output tokens) of each turn in order: turn k's prompt holds every earlier turn's
        message and answer (answers of exactly their output length: EOS is ignored)."""
        lens, prompt_len, output_len = [(self.input_len, self.output_len)], self.input_len, self.output_len
        for message, next_output_len in self.next_turns:
            prompt_len += output_len + len(message)
            output_len = next_output_len
            lens.append((prompt_len, output_len))
        return lens

    @property
    def last_turn_lens(self) -> tuple[int, int]:
        """(prompt tokens, output tokens) of the conversation's last turn."""
        return self.turn_lens[-1]


def length_bounds(length: int, range_ratio: float) -> tuple[int, int]:
    """Inclusive bounds of the lengths drawn for ``length`` and ``range_ratio``."""
    return max(1, int(length * (1 - range_ratio))), max(1, int(length * (1 + range_ratio)))


def sample_lengths(rng: np.random.Generator, n: int, length: int, range_ratio: float) -> list[int]:
    lo, hi = length_bounds(length, range_ratio)
    return rng.integers(lo, hi + 1, size=n).tolist()


def numpy_rng(seed: int) -> np.random.Generator:
    """numpy's generator for ``seed``, an engine seed (an integer in [-2^63, 2^63 - 1]) or one made from it: numpy
    takes seeds >= 0 only, so a negative seed is read as its 64 bits, as torch reads it."""
    return np.random.default_rng(seed % 2**64 if seed < 0 else seed)


def random_requests(
    num_prompts: int,
    input_len: int,
    output_len: int,
    range_ratio: float,
    vocab_size: int,
    seed: int,
    prefix_len: int = 0,
    num_turns: int = 1,
) -> list[BenchRequest]:
    """``num_prompts`` prompts of random token ids in ``[0, vocab_size)``: each one shared prefix of
    ``prefix_len`` ids (vLLM's ``--random-prefix-len``) followed by its own ``input_len`` (drawn) ids. With
    ``num_turns`` > 1 each prompt opens a conversation whose later turns each add a new message of drawn length.
    Draws without a prefix or turns are those of earlier versions (the same flags give the same prompts)."""
    rng = numpy_rng(seed)
    in_lens = sample_lengths(rng, num_prompts, input_len, range_ratio)
    out_lens = sample_lengths(rng, num_prompts, output_len, range_ratio)
    prompts = [rng.integers(0, vocab_size, size=n).tolist() for n in in_lens]
    if prefix_len:
        prefix = rng.integers(0, vocab_size, size=prefix_len).tolist()
        prompts = [prefix + p for p in prompts]
    turns = [[] for _ in prompts]
    for _ in range(num_turns - 1):
        msg_lens = sample_lengths(rng, num_prompts, input_len, range_ratio)
        outs = sample_lengths(rng, num_prompts, output_len, range_ratio)
        for t, n, o in zip(turns, msg_lens, outs):
            t.append((rng.integers(0, vocab_size, size=n).tolist(), o))
    return [BenchRequest(p, o, tuple(t)) for p, o, t in zip(prompts, out_lens, turns)]


class PromptsFileError(Refused):
    """A prompts file that cannot be used (not UTF-8 text, no prompts in it, a malformed JSONL line); the record
    names the file (and the line: its ``origin``)."""

    __reduce__ = Refused.reduce_from_record


def numbered_lines(path: str) -> list[tuple[int, str]]:
    """``(line number, line)`` for the non-blank lines of the UTF-8 text file ``path``, without their line ends
    (``\n``, ``\r\n``, ``\r``); lines count from 1, blank ones included.

    Raises OSError, and PromptsFileError naming the first byte that is not UTF-8 and its offset in the file.
    """
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")  # the whole file at once: the error's start is the offset in the file
    except UnicodeDecodeError as e:
        raise PromptsFileError(not_utf8_file(path, data[e.start], e.start)) from None
    return [(n, line.rstrip("\n")) for n, line in enumerate(io.StringIO(text, newline=None), 1) if line.strip()]


def text_lines(path: str) -> list[str]:
    """The non-blank lines of the UTF-8 text file ``path``, without their line ends. Raises as
    :func:`numbered_lines`."""
    return [line for _, line in numbered_lines(path)]


def prompt_of_line(path: str, number: int, line: str) -> str:
    """The prompt on line ``number`` of prompts file ``path``: the line itself, or, for a line that starts with
    ``{`` (JSONL), its object's ``"prompt"``. Raises PromptsFileError naming the file, the line and what is wrong
    with it (malformed JSON, no ``"prompt"`` key, a prompt that is not a non-empty string) and :data:`PROMPT_LINE`."""
    if not line.lstrip().startswith("{"):
        return line
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise PromptsFileError(bad_prompt_line(path, number, malformed("JSON", e.msg), e.colno)) from None
    except RecursionError:
        raise PromptsFileError(bad_prompt_line(path, number, malformed("JSON", NESTED_TOO_DEEPLY))) from None
    if "prompt" not in obj:
        raise PromptsFileError(bad_prompt_line(path, number, missing_prompt_key(list(obj))))
    prompt = obj["prompt"]
    if not isinstance(prompt, str) or not prompt:
        raise PromptsFileError(bad_prompt_line(path, number, prompt_not_text(prompt)))
    return prompt


def read_prompts_file(path: str) -> list[str]:
    """One prompt per non-blank line, as :func:`prompt_of_line` reads it. Raises as :func:`numbered_lines` and
    :func:`prompt_of_line`."""
    return [prompt_of_line(path, number, line) for number, line in numbered_lines(path)]


def file_requests(
    prompts: list[list[int]], num_prompts: int | None, output_len: int, range_ratio: float, seed: int
) -> list[BenchRequest]:
    """Tokenized prompts (cycled to ``num_prompts`` when given), output lengths drawn as for random ones."""
    n = len(prompts) if num_prompts is None else num_prompts
    rng = numpy_rng(seed)
    out_lens = sample_lengths(rng, n, output_len, range_ratio)
    return [BenchRequest(list(prompts[i % len(prompts)]), o) for i, o in enumerate(out_lens)]
