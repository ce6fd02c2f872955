"""The words of a config value refused: what a config field allows (from its type and metadata), an engine
argument or attention_config key that names nothing, a config file that is no mapping, a record of another kind.

``config/`` (fields, records, files, engine arguments) and the command line's engine flags refuse with these.
"""

from __future__ import annotations

from attnserve.refusals import PYTHON, TEXT, Refusal, range_words

# ---------------------------------------------------------------- config fields (config/fields.py)

TYPE_WORDS = {bool: "true, false", int: "integer", float: "number", str: "string"}
"""A config field's type as its allowed values: ``integer``, ``true, false``."""
TYPE_NOUNS = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
"""What a value of another type is not: ``'32' is a string, not an integer``."""
HUMAN_INT_WORDS = (
    "suffixes as in vLLM: k, m, g, t = 10^3, 10^6, 10^9, 10^12 (with a fraction: 1.5k); "
    "K, M, G, T = 2^10, 2^20, 2^30, 2^40 (whole numbers only)"
)
"""What :func:`attnserve.config.fields.parse_human_int` takes beyond a plain integer."""


def field_words(base: type, optional: bool, meta: dict) -> str:
    """A config field's allowed values from its type and metadata (``words``, ``choices``, ``gt``/``ge``/``le``,
    ``unit``): ``integer >= 1``, ``2, 3, 4, null``, ``integer >= 1 (bytes), null``."""
    if "words" in meta:
        words = meta["words"]
    elif "choices" in meta:
        words = ", ".join(str(c) for c in meta["choices"])
    else:
        low = next(((op, meta[k]) for k, op in (("gt", ">"), ("ge", ">=")) if k in meta), None)
        words = range_words(
            TYPE_WORDS.get(base, getattr(base, "__name__", str(base))),
            low,
            ("<=", meta["le"]) if "le" in meta else None,
        )
        if "unit" in meta:
            words += f" ({meta['unit']})"
    return words + (", null" if optional else "")


# ---------------------------------------------------------------- config records (config/*.py)


def backend_names_words(valid: list[str], null: bool = False) -> str:
    """The attention backend names allowed: ``FLASH_ATTN, ..., auto`` (``, null`` where null is allowed)."""
    return f"{', '.join(valid)}, auto" + (", null" if null else "")


A_BACKEND_NAME = "a backend name"
A_MAPPING_OF_FIELDS = "a mapping of field names to values"


def unknown_attention_field(key: object, valid: list[str], where: str, suggestion: str | None, name: str) -> Refusal:
    """An ``attention_config`` key that names no field; ``where``: ``in cfg.yaml``, ``in -ac`` (TEXT spelling)."""
    return Refusal(
        value=key,
        allowed=", ".join(valid),
        reason=where,
        subject="unknown attention_config field",
        suggestion=suggestion,
        key=f"attention_config.{name}",
        written=TEXT if where else PYTHON,
    )


def unknown_record_field(record: str, key: object, valid: list[str], suggestion: str | None) -> Refusal:
    """A keyword of a config record built in Python (``CacheConfig(foo=1)``) that names none of its fields."""
    return Refusal(
        value=key,
        allowed=", ".join(valid),
        reason="",  # the subject says it: no "not allowed"
        subject=f"unknown {record} field",
        suggestion=suggestion,
        key=str(key).replace("-", "_"),
    )


KV_SCALES_NEED_FP8 = Refusal(
    ("calculate_kv_scales",),
    True,
    reason="needs an fp8 KV cache (scales are for fp8)",
    advice="set {kv_cache_dtype} fp8, or drop {calculate_kv_scales}",
    key="calculate_kv_scales",
)


def not_a_record(value: object, field: str, cls: type) -> Refusal:
    """An EngineConfig section given as something other than its record: ``EngineConfig.cache {} is not a
    CacheConfig``."""
    return Refusal(value=value, subject=f"EngineConfig.{field}", noun=f"a {cls.__name__}")


GENERATION_CONFIG_WORDS = "auto, vllm, or a folder holding a generation_config.json"
NO_FOLDER = "is no folder"


# ---------------------------------------------------------------- engine arguments (config/engine_args.py, cli/)


def unknown_key(key: object, valid: list[str], where: str, suggestion: str | None, field: str = "FIELD") -> Refusal:
    """A config file's (or ``-ac``'s) key that names no engine argument; ``where``: ``in cfg.yaml``."""
    return Refusal(
        value=key,
        allowed=f"{', '.join(valid)}, attention_config.{field}",
        reason=where,
        subject="unknown key",
        suggestion=suggestion,
        written=TEXT,
    )


def unknown_engine_argument(key: str, valid: list[str], suggestion: str | None) -> Refusal:
    """A Python keyword argument (``LLM(blocksize=16)``) that names no engine argument."""
    return Refusal(
        value=key, allowed=", ".join(valid), reason="", subject="unknown engine argument", suggestion=suggestion
    )


ATTENTION_OBJECT = "an object of field names to values"


def backends_conflict(other_label: str, other_value: str) -> dict:
    """The fields of a refusal of two settings naming different attention backends (``--attention-backend`` and
    ``attention_config.backend``): after the value, ``conflicts with OTHER VALUE ...``."""
    return {
        "reason": f"conflicts with {other_label} {other_value}: they name different backends",
        "advice": "set the attention backend in one place",
    }


def spellings_conflict(other_spelling: str, other_value: str) -> dict:
    """The fields of a refusal of one setting given twice in one place under two spellings with different values
    (``block-size`` and ``block_size`` in one file, ``--num-gpu-blocks-override`` and ``--num-gpu-blocks``): after
    the value, ``conflicts with OTHER VALUE ...``."""
    return {
        "reason": f"conflicts with {other_spelling} {other_value}: two spellings of one setting",
        "advice": "give it once",
    }


def model_given_twice(other_label: str, other_value: object) -> dict:
    """The fields of a refusal of a model given twice (``MODEL`` and ``--model``)."""
    return {
        "reason": f"conflicts with {other_label} {other_value!r}: the model is given twice",
        "advice": "give it once",
    }


# ---------------------------------------------------------------- config files (config/files.py)


def duplicate_key(key: object) -> str:
    return f"duplicate key {key!r}"


def malformed(fmt: str, problem: str, line: int | None = None, column: int | None = None) -> str:
    """A file (or option) that is no valid ``fmt`` (JSON, YAML); ``line``/``column`` when no origin names them."""
    where = f" (line {line}, column {column})" if line is not None else ""
    return f"malformed {fmt}{where}: {' '.join(problem.split())}"


NESTED_TOO_DEEPLY = "nested too deeply"


def unreadable_config_file(path: str, why: str) -> str:
    return f"cannot read config file {path!r}: {why}"


def not_utf8_text(reason: str) -> str:
    return f"not UTF-8 text ({reason})"


def config_mapping_words(fmt: str) -> str:
    """What a config file must hold, its example in the file's format (``json`` or ``yaml``)."""
    example = '{"dtype": "float32"}' if fmt == "json" else "'dtype: float32'"
    return f"a mapping of engine argument names to values, e.g. {example}, or {{}} for no settings"


EMPTY_CONFIG_FILE = "empty config file"
ONLY_COMMENTS = "the config file holds only comments"


def top_level_is(data: object) -> str:
    """A decoded top level that is not a mapping, in the file's words: ``the top level is null``, ``... a list``,
    ``... the string 'dtype float32'``, ``... the number 5``, ``... true``."""
    if data is None:
        what = "null"
    elif isinstance(data, bool):
        what = str(data).lower()
    elif isinstance(data, list):
        what = "a list"
    elif isinstance(data, str):
        what = f"the string {data!r}"
    elif isinstance(data, (int, float)):
        what = f"the number {data!r}"
    else:
        what = f"a {type(data).__name__}"  # a YAML date, timestamp or binary
    return f"the top level is {what}"
