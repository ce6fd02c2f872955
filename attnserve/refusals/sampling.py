"""The words of a request's sampling parameters and output constraint: what each SamplingParams field and each
StructuredOutputsParams kind allows, and why a value the engine cannot honour is refused.

``core/sampling_params.py``, ``core/structured_outputs.py``, ``engine/input_checks.py``, ``engine/bad_words.py`` and
``structured_output/`` refuse with these; ``attnserve generate``'s flags name the same ranges.
"""

from __future__ import annotations

from attnserve.refusals import Refusal, range_words

SEED_WORDS = "integer in [-2^63, 2^63 - 1]"
"""Every seed's range (the engine's, a request's): 64-bit integers."""

ALLOWED = {
    "n": range_words("integer", (">=", 1), None),
    "temperature": range_words("finite number", (">=", 0), None),
    "top_p": range_words("number", (">", 0), ("<=", 1)),
    "top_k": "0 or -1 (all), or " + range_words("integer", (">=", 1), None),
    "min_p": range_words("number", (">=", 0), ("<=", 1)),
    "seed": SEED_WORDS + ", or None",  # the engine's seed, and the server's, take the same range
    "max_tokens": range_words("integer", (">=", 1), None),
    "logprobs": range_words("integer", (">=", 0), None),  # at most the engine's max_logprobs (LLMEngine.check_params)
    "prompt_logprobs": range_words("integer", (">=", 0), None),  # the same
    "presence_penalty": range_words("number", (">=", -2), ("<=", 2)),
    "frequency_penalty": range_words("number", (">=", -2), ("<=", 2)),
    "repetition_penalty": range_words("finite number", (">", 0), None),
    "min_tokens": range_words("integer", (">=", 0), None) + ", at most max_tokens",
    "truncate_prompt_tokens": "-1 (max_model_len), or " + range_words("integer", (">=", 1), None) + ", or None",
    "stop": "a string, a list of strings, or None",
    "stop_token_ids": "a list of token ids, or None",
    "logit_bias": "a dict of token id -> bias, or None",
    "bad_words": "a list of strings, or None",
    "allowed_token_ids": "a non-empty list of token ids, or None",
    "structured_outputs": "a StructuredOutputsParams, a dict of its fields, or None",
}
"""Each SamplingParams field's allowed values in words (:func:`~attnserve.refusals.range_words`, as every range the
CLI and the config records name)."""

ITEMS = {
    "stop": "non-empty strings",
    "stop_token_ids": "token ids (integers >= 0)",
    "bad_words": "strings",
    "allowed_token_ids": "token ids (integers >= 0)",
}
"""What each item of a list field allows (the refusal names the first bad item by its index)."""

STOP_NEEDS_TEXT = "none when detokenize is False: stop strings match text"
LOGIT_BIAS_KEYS = "token ids (integers >= 0) as keys"
LOGIT_BIAS_VALUES = "finite numbers as values"
BAD_WORD = "words that tokenize to at least one token"


def truncate_over_max_model_len_words(max_model_len: int) -> str:
    """``truncate_prompt_tokens`` past the engine's max_model_len (vLLM refuses it too)."""
    return f"-1 (max_model_len), or integer in [1, {max_model_len}], the engine's max_model_len, or None"


def max_logprobs_words(max_logprobs: int) -> str:
    """``logprobs`` (``prompt_logprobs``) past the engine's ``--max-logprobs``."""
    return f"integer in [0, {max_logprobs}], the engine's max_logprobs (--max-logprobs)"


def token_ids_as_keys(token_id_words: str) -> str:
    """``logit_bias`` keys past the vocabulary."""
    return f"token ids as keys: {token_id_words}"


def lone_surrogate_in_prompt(path: tuple[str | int, ...], prompt: str, index: int) -> Refusal:
    """Prompt text holding half of a UTF-16 surrogate pair (``"\\ud800"``): no Unicode character."""
    return Refusal(path, prompt, "Unicode text", reason=f"holds a lone surrogate {prompt[index]!r} at index {index}")


# ---------------------------------------------------------------- output constraints (core/structured_outputs.py)

KINDS = ("json", "regex", "choice", "grammar", "json_object")
ONE_KIND = "exactly one of " + ", ".join(KINDS)
KIND_WORDS = {
    "json": "a JSON schema (an object, or its JSON text)",
    "regex": "a string",
    "choice": "a non-empty list of strings",
    "grammar": "a non-empty EBNF string",
    "json_object": "true",
}
"""What each constraint kind's value must be."""
TRUE_OR_FALSE = "true or false"
_WHAT = {
    "json": "JSON schema",
    "regex": "regular expression",
    "choice": "choice list",
    "grammar": "EBNF grammar",
    "json_object": "JSON object",
}
STRUCTURED_EXTRA = "pip install 'attnserve[structured]'"


def not_one_kind(given: dict[str, object]) -> Refusal:
    """A constraint setting none, or several, of the kinds; ``given``: the kinds it set and their values (the
    refusal's value: ``{}`` for none, as a client sends it)."""
    return Refusal(
        ("structured_outputs",),
        given,
        ONE_KIND,
        reason="sets " + (", ".join(given) if given else "none of them"),
    )


def unknown_constraint_key(path: tuple[str | int, ...], key: str, value: object, names: list[str]) -> Refusal:
    # no subject: the path names the key (a subject would hide it: "unknown key 1 not allowed")
    return Refusal((*path, key), value, "one of the keys " + ", ".join(names))


NO_XGRAMMAR = Refusal(
    ("structured_outputs",), reason="needs the grammar engine xgrammar, which is not installed", advice=STRUCTURED_EXTRA
)


def invalid_constraint(kind: str, value: object, reason: str) -> Refusal:
    """A schema, regex or grammar xgrammar cannot compile, with the first line of its reason."""
    return Refusal(("structured_outputs", kind), value, reason=f"is not a valid {_WHAT[kind]}: {reason}")
