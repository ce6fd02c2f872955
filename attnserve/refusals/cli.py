"""The words of a command line's refusals: a flag's value, a file a flag names (prompts, output), flags the
parser does not know. Each is placed at its flag (``argument --prompts-file: ...``), as argparse's own are.

``entrypoints/cli/`` refuses with these; ``benchmarks/`` too, for the prompts files ``bench`` reads.
"""

from __future__ import annotations

import json

from attnserve.refusals import PYTHON, TEXT, Refusal, flag


LOGIT_BIAS = "TOKEN_ID=BIAS"
"""What one ``--logit-bias`` flag takes."""
DEFAULT_PROMPT_ADVICE = "leave --prompt out for the default prompt"
"""``attnserve generate``'s way out of an empty ``--prompt``."""


def output_file_words(problem: str) -> str:
    """What an output file flag (``--output-json``, ``--plot``) allows, and what is wrong with the one given."""
    return f"a file path in an existing, writable folder; {problem}"


def output_file_problem(text: str, folder: str, is_dir: bool, exists: bool) -> str:
    if not text or is_dir:
        return "it is a folder" if text else "it is empty"
    return f"folder {folder} does not exist" if not exists else f"folder {folder} is not writable"


def format_with_explain(fmt: str) -> Refusal:
    """``attnserve config --format X --explain``: --explain prints a table, in no file format."""
    return Refusal(
        value=fmt,
        reason="not allowed with --explain, which prints a table of values and their sources, not a config file",
        advice="leave out --format, or --explain for the config file",
        origin="argument --format",
        names_path=True,
        written=TEXT,
    )


PROMPT_LINE = 'each line must be a prompt as plain text, or a JSON object with a non-empty "prompt" string'
"""What a line of a prompts file must be; the advice of every refusal of one line."""


def not_utf8_file(path: str, byte: int, offset: int) -> Refusal:
    """A prompts file that is not UTF-8 text, its first bad byte and that byte's offset in the file."""
    return Refusal(subject=path, reason=f"is not UTF-8 text (byte 0x{byte:02x} at offset {offset})")


def bad_prompt_line(path: str, number: int, problem: str, column: int | None = None) -> Refusal:
    """Line ``number`` of prompts file ``path`` (at ``column``), and what is wrong with it."""
    return Refusal(reason=problem, advice=PROMPT_LINE, origin=f"{path}:{number}" + (f":{column}" if column else ""))


def missing_prompt_key(keys: list) -> str:
    """A JSONL line's object without ``"prompt"``: its first keys, or that it is empty."""
    shown = ", ".join(json.dumps(k) for k in keys[:5]) + (", ..." if len(keys) > 5 else "")
    return f'missing key "prompt" ({f"its keys: {shown}" if keys else "the object is empty"})'


def prompt_not_text(prompt: object) -> str:
    """A JSONL line's ``"prompt"`` that is no non-empty string."""
    return f'"prompt" is {"empty" if prompt == "" else f"{json.dumps(prompt)[:60]}, not a string"}'


def at_flag(refusal: Refusal, flag: str) -> Refusal:
    """A prompts file's refusal placed at the flag that named the file: ``argument --prompts-file: PATH:3: ...``."""
    return refusal.at(f"argument {flag}: {refusal.origin}" if refusal.origin else f"argument {flag}", written=PYTHON)


RANDOM_PROMPTS, THE_DEFAULT_PROMPT = "random prompts", "the default prompt"
"""What a command takes without its prompts file: ``bench``'s random prompts, ``generate``'s default prompt."""


def no_prompts(path: str, flag: str, instead: str) -> Refusal:
    """A prompts file ``path`` given by ``flag`` with no prompt in it; without the flag the command takes
    ``instead`` (``the default prompt``, ``random prompts``); a command line places it at the flag (:func:`at_flag`)."""
    return Refusal(
        subject=path, reason="has no prompts", advice=f"give one prompt per line, or leave {flag} out for {instead}"
    )


def argument(name: str) -> str:
    """Where a flag's refusal is: ``argument --max-tokens`` for ``max_tokens`` (or for ``--max-tokens``)."""
    return f"argument {name if name.startswith('-') else flag(name)}"


def at_argument(refusal: Refusal, name: str, written: str = PYTHON) -> Refusal:
    """A refusal of a value the flag ``name`` (``max_tokens``, ``--max-tokens``) gave: the flag names the setting."""
    return refusal.at(argument(name), names_path=True, written=written)


def logprobs_need_output_json(name: str, value: object) -> Refusal:
    """generate's ``--logprobs`` / ``--prompt-logprobs`` without ``--output-json``: the terminal shows text only."""
    return Refusal(
        (name,),
        value,
        reason="needs --output-json FILE",
        advice="the terminal shows the text only; logprobs are written to that file",
    )


def unreadable_file(flag_: str, filename: object, strerror: str | None) -> Refusal:
    """A file a flag names that cannot be opened: ``argument --prompts-file: x.txt: No such file or directory``."""
    return Refusal(reason=strerror or "cannot be read", origin=f"{argument(flag_)}: {filename}")


def no_value(flag_: str, value: object, forms: str) -> Refusal:
    """A value given to a flag that takes none (``--enforce-eager true``)."""
    return Refusal(value=value, subject="value", allowed=no_value_forms(forms), origin=argument(flag_), written=PYTHON)


def unrecognized_arguments(extras: list[str], near: str | None) -> str:
    """argparse's words for flags no parser knows, and the closest known flag."""
    return f"unrecognized arguments: {' '.join(extras)}" + (f"; did you mean {near!r}?" if near else "")


def not_json(text: str, error: Exception) -> Refusal:
    return Refusal(value=text, reason=f"is no JSON ({error})", allowed=JSON_OBJECT, written=TEXT)


JSON_OBJECT = "a JSON object"


def not_json_object(text: str) -> Refusal:
    return Refusal(value=text, allowed=JSON_OBJECT, written=TEXT)


def model_unreadable(error: Exception) -> str:
    """``attnserve backends --model`` naming no model; the shape flags are the way out."""
    return f"argument --model: {error} (or pass --head-size, --num-heads, --num-kv-heads)"


def no_value_forms(forms: str) -> str:
    """What a flag that takes no value allows: ``no value: --enforce-eager or --no-enforce-eager``."""
    return f"no value: {forms}"
