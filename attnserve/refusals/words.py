"""The vocabulary refusals are worded in: what a config field, a chat message or a prompt allows, in words.

Each is the ``allowed`` (or ``noun``) of a :class:`~attnserve.refusals.Refusal`; the modules that check the values
import them from here, so that one place holds every phrase a refusal says.
"""

from __future__ import annotations

import json

from attnserve.refusals import JSON, PYTHON, TEXT, Refusal, range_words

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


# ---------------------------------------------------------------- the scheduler (engine/scheduler.py)


def prompt_exceeds_kv_cache(
    num_tokens: int, blocks_needed: int, num_blocks: int, block_size: int, kv_cache_key: str | None
) -> Refusal:
    """A prompt the whole KV cache cannot hold (with the one token it generates), keyed to the cache's size setting
    (``kv_cache_key``: ``num_gpu_blocks``, ``kv_cache_memory``; None: no setting sized it)."""
    capacity = num_blocks * block_size
    return Refusal(
        reason=f"prompt of {num_tokens} tokens needs {blocks_needed} KV blocks ({num_tokens + 1} tokens with the "
        f"one it generates), the KV cache has {num_blocks} ({capacity} tokens), so at most {capacity - 1} prompt "
        "tokens fit",
        advice=f"raise {{{kv_cache_key}}}" if kv_cache_key else "give the KV cache more memory",
        key=kv_cache_key,
    )


def prompt_exceeds_step(num_tokens: int, max_num_batched_tokens: int) -> Refusal:
    """A prompt longer than one step's token budget, with chunked prefill off."""
    return Refusal(
        reason=f"prompt of {num_tokens} tokens exceeds max_num_batched_tokens {max_num_batched_tokens}, and "
        "enable_chunked_prefill is false: a prompt must fit one step",
        key="max_num_batched_tokens",
    )


# ---------------------------------------------------------------- KV cache and ranks (model_executor/kv_cache.py, distributed/)


def kv_cache_beyond_memory(blocks: int, block_bytes: int, available: int, device: object, key: str) -> Refusal:
    """A KV cache asked for by block count or bytes (``key``) that the device's free memory cannot hold."""
    fit = max(0, available) // block_bytes
    return Refusal(
        reason=f"a KV cache of {blocks} blocks ({blocks * block_bytes / 2**30:.2f} GiB) does not fit in the "
        f"{max(0, available) / 2**30:.2f} GiB of {device} memory available now "
        f"({fit} block{' fits' if fit == 1 else 's fit'})",
        advice=f"lower {{{key}}}",
        key=key,
    )


def budget_holds_no_block(budget: int, block_bytes: int, key: str) -> Refusal:
    return Refusal(
        reason=f"KV-cache budget of {budget} bytes holds no block of {block_bytes} bytes",
        advice=f"raise {{{key}}} or set {{num_gpu_blocks}}",
        key=key,
    )


def kv_cache_shorter_than_max_model_len(max_model_len: int, num_blocks: int, block_size: int, key: str) -> Refusal:
    """A KV cache that cannot hold one request of ``max_model_len`` tokens (vLLM refuses to start too)."""
    capacity = num_blocks * block_size
    blocks = f"{num_blocks} block{'s' if num_blocks != 1 else ''} of {block_size}"
    return Refusal(
        reason=f"the KV cache holds {capacity} tokens ({blocks}), fewer than max_model_len {max_model_len}, so not "
        "one request of max_model_len tokens fits",
        advice=f"lower {{max_model_len}} to at most {capacity} or raise {{{key}}}",
        key=key,
    )


def heads_not_grouped(num_heads: int, num_kv_heads: int) -> Refusal:
    """A model whose query heads are no multiple of its KV heads (no tensor-parallel size splits them)."""
    return Refusal(reason=f"{num_heads} query heads are not a multiple of {num_kv_heads} KV heads")


def heads_cannot_split(size: int, num_heads: int, num_kv_heads: int, group: int) -> Refusal:
    return Refusal(
        ("tensor_parallel_size",),
        size,
        reason=f"cannot split {num_heads} query heads over {num_kv_heads} KV heads: with fewer KV heads than ranks "
        f"the ranks must be a multiple of the KV heads and divide each KV head's {group} query heads",
    )


def sizes_for_this_model(sizes: list[int]) -> str:
    """The tensor-parallel sizes a model's heads split over: ``1, 2, 4 for this model``."""
    return f"{', '.join(map(str, sizes))} for this model"


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


# ---------------------------------------------------------------- requests (engine/request_checks.py, chat_utils.py)

EMPTY_PROMPT = "a prompt of at least 1 token"
THE_PROMPT = "the prompt"
"""How a context-length refusal names the one prompt of a call (a batch's: by its place, ``prompts[1]``)."""


def params_per_prompt(given: int, prompts: int) -> str:
    """``LLM.generate`` given a list of SamplingParams that is not one per prompt."""
    return f"{given} sampling params for {prompts} prompts"


def prompt_too_long(num_prompt_tokens: int, max_model_len: int, prompt: str) -> Refusal:
    """A prompt that alone leaves no room for a generated token (OpenAI's wording, which names the context length,
    and which OpenAI clients look for), keyed to ``max_model_len``."""
    return Refusal(
        reason=f"This model's maximum context length is {max_model_len} tokens. However, {prompt} has "
        f"{num_prompt_tokens} tokens, which leaves no room for the completion (at most {max_model_len - 1} "
        "prompt tokens fit).",
        advice="Please raise {max_model_len} or reduce the length of the prompt.",
        key="max_model_len",
    )


def max_tokens_too_large(num_prompt_tokens: int, max_tokens: int, max_model_len: int, prompt: str) -> Refusal:
    """A prompt that fits, but not with ``max_tokens`` more (OpenAI's wording)."""
    return Refusal(
        reason=f"This model's maximum context length is {max_model_len} tokens. However, you requested "
        f"{num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in {prompt}, {max_tokens} in the "
        "completion).",
        advice="Please reduce the length of the prompt or completion.",
    )


def token_id_words(vocab_size: int) -> str:
    """The allowed token ids in words: ``integer in [0, 49152), the vocabulary size``."""
    return f"{range_words('integer', ('>=', 0), ('<', vocab_size))}, the vocabulary size"


CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")  # protocol.ChatMessage.role's Literal
MESSAGES_WORDS = "a non-empty list of chat messages"
CONVERSATIONS_WORDS = f"{MESSAGES_WORDS}, or a list of such lists"
"""What ``LLM.chat`` takes: one conversation or a batch of them."""
MESSAGE_WORDS = 'an object with "role" and "content", optionally "name", "tool_calls" and "tool_call_id"'
ROLE_WORDS = ", ".join(json.dumps(r) for r in CHAT_ROLES)
CONTENT_WORDS = 'a string, or a non-empty list of text parts {"type": "text", "text": string}'
TEXT_PART = 'a text part {"type": "text", "text": string}'
TEXT_PART_WORDS = 'an object with "type" and "text"'
TEXT_TYPE = '"text"'
A_LIST, A_CHAT_MESSAGE = "a list", "a chat message"
STRING, A_STRING = "string", "a string"
NAME_WORDS = "string, or None"
ONLY_ON_ASSISTANT = "only on an assistant message"
TOOL_CALL_WORDS = '{"id": string, "type": "function", "function": {"name": string, "arguments": JSON text}}'
JSON_TEXT = "JSON text"

# ---------------------------------------------------------------- request bodies (openai/body.py)


def body_not_utf8(byte: int, offset: int, reason: str) -> Refusal:
    return Refusal(
        reason=f"the request body is not valid UTF-8 (byte 0x{byte:02x} at offset {offset}: {reason})",
        advice="send JSON encoded as UTF-8",
    )


def body_too_deep(levels: int, max_depth: int) -> Refusal:
    return Refusal(
        reason=f"the request body nests arrays and objects {levels} levels deep", allowed=f"at most {max_depth}"
    )


def body_integer_too_long(max_digits: int) -> Refusal:
    return Refusal(
        reason=f"the request body holds an integer of more than {max_digits} digits, more than any field allows"
    )


def lone_surrogate(path: tuple[str | int, ...], string: str, index: int) -> Refusal:
    """A JSON string holding half of a UTF-16 surrogate pair (``\\ud800`` alone) at ``index``."""
    return Refusal(
        path,
        string,
        "Unicode text; a surrogate escape needs its pair",
        written=JSON,
        reason=f"holds a lone surrogate {json.dumps(string[index])[1:-1]} at index {index}",
    )


# ---------------------------------------------------------------- the server's chat fields (openai/serving_chat.py, tools.py)

NEEDS_LOGPROBS = "needs logprobs: true"
USE_TOOLS = "use tools and tool_choice"


def deprecated_functions(names: list) -> Refusal:
    """OpenAI's deprecated ``functions`` (refused, as vLLM refuses it), by the functions' names."""
    return Refusal(("functions",), names, "absent, null or []", reason="not supported", advice=USE_TOOLS)


def deprecated_function_call(choice: object) -> Refusal:
    return Refusal(("function_call",), choice, 'absent, null or "none"', reason="not supported", advice=USE_TOOLS)


def constrained_twice(field: str, tool_choice: str) -> Refusal:
    """An output constraint (``response_format``, ``structured_outputs``) beside a tool choice that constrains."""
    return Refusal(
        (field,),
        reason=f"not allowed together with tool_choice {tool_choice}: the tools' schemas constrain the output already",
    )


def untrusted_chat_template(path: tuple[str, ...]) -> Refusal:
    return Refusal(
        path,
        reason="a request's own chat template is refused: the server was started without --trust-request-chat-template",
    )


def tools_needed(choice: object) -> Refusal:
    return Refusal(("tool_choice",), choice, reason="needs tools (tools is empty or absent)")


AUTO_TOOL_CHOICE = Refusal(
    reason='"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
)
"""vLLM's words (param ``tool_choice``)."""


def not_a_tool(name: str, names: list[str]) -> Refusal:
    """A named tool_choice function that is not among the request's tools."""
    return Refusal(("tool_choice",), name, ", ".join(map(repr, names)), reason="is not among the tools")


# ---------------------------------------------------------------- LLM.generate's prompt dicts (entrypoints/llm.py)


PROMPT_KINDS = "text, a list of token ids, or a dict {'prompt': text} or {'prompt_token_ids': ids}"


def not_a_prompt(path: tuple[str | int, ...], value: object) -> Refusal:
    """``LLM.generate``'s prompt that is none of its kinds (None, bytes, a number)."""
    return Refusal(tuple(path), value, PROMPT_KINDS, noun="a prompt")


def prompt_dict_value(path: tuple[str | int, ...], key: str, value: object) -> Refusal:
    """A ``{"prompt": ...}`` or ``{"prompt_token_ids": ...}`` prompt whose value is of another kind."""
    return Refusal((*path, key), value, "a string" if key == "prompt" else "a list of token ids")


def prompt_dict_keys(path: tuple[str | int, ...], keys: list) -> Refusal:
    """A prompt dict with other keys than one of ``prompt``, ``prompt_token_ids``."""
    return Refusal(tuple(path), keys, "exactly one of the keys 'prompt', 'prompt_token_ids'")


# ---------------------------------------------------------------- chat templates (entrypoints/chat_utils.py)


def unreadable_template(path: tuple[str | int, ...], name: str, error: OSError) -> Refusal:
    """A ``--chat-template`` (request ``chat_template``) that names a file that cannot be read."""
    return Refusal(path, name, "a Jinja template file, or the template's text", reason=f"cannot be read ({error})")


CONTINUE_FINAL_MESSAGE = Refusal(
    ("continue_final_message",),
    True,
    "false while add_generation_prompt is true",
    advice="set add_generation_prompt false to continue the final message",
)
TEMPLATE_KWARGS_WORDS, A_MAPPING = "a mapping of template variables, or None", "a mapping"


def reserved_template_kwarg(name: str, value: object) -> Refusal:
    """``chat_template_kwargs`` naming ``chat_template`` or ``tokenize``: no template variables."""
    advice = "give the template as chat_template" if name == "chat_template" else ""
    return Refusal(("chat_template_kwargs", name), value, "absent", advice=advice)


NO_CHAT_TEMPLATE = Refusal(
    ("chat_template",),
    reason="is needed: this model's tokenizer has none",
    advice="give one (--chat-template, the request's chat_template), or send the prompt text as a completion",
)


def template_failed(given: bool, error: Exception) -> Refusal:
    """What a chat template raised, named by ``chat_template`` when the request (or flag) ``given`` it, else by
    ``messages``."""
    what = f"{type(error).__name__}: {error}"
    if given:
        return Refusal(("chat_template",), reason=f"failed on the messages ({what})")
    return Refusal(("messages",), reason=f"cannot be rendered by the chat template ({what})")
