"""The words of the server's own refusals (those every surface shares are in ``requests.py`` and
``sampling.py``): the engine not ready (503), a model or key the server does not take (404, 401), a body that is
no JSON it reads, OpenAI features attnserve does not implement or takes only together, requests over a limit.

``entrypoints/openai/`` answers with these, and ``engine/async_engine.py`` raises its not-ready errors with them
(the server's 503 quotes them).
"""

from __future__ import annotations

import json

from attnserve.refusals import JSON, Refusal

# ---------------------------------------------------------------- the engine's state (engine/async_engine.py, 503)

STILL_LOADING = "the engine is still loading"
MODEL_STILL_LOADING = "the model is still loading"
SHUTTING_DOWN = "the server is shutting down"
STARTING = "the server is starting (loading the model); retry later"
SHUTTING_DOWN_RETRY = "the server is shutting down; retry later (on another replica)"


def engine_dead(error: BaseException) -> str:
    """A request to an engine whose step or worker failed (the async engine's words)."""
    return f"the engine is dead: {type(error).__name__}: {error}"


def engine_dead_restart(error: BaseException) -> str:
    """The server's 503 for a dead engine."""
    return f"the engine is dead ({error}); restart the server"


def step_failed(error: BaseException) -> str:
    return f"engine step failed: {type(error).__name__}: {error}"


def load_failed(summary: str) -> str:
    return f"the model failed to load: {summary}"


# ---------------------------------------------------------------- who asks for what (server.py, serving.py)

WRONG_API_KEY = "missing or wrong API key (send 'Authorization: Bearer <key>')"


def no_such_model(name: str, served: list[str]) -> str:
    """A model name this server does not serve (404, as OpenAI and vLLM answer)."""
    return f"model {name!r} does not exist (served: {', '.join(served)})"


def internal_error(error: BaseException) -> str:
    """A 500: what failed, for the client's log (the server's log has the traceback)."""
    return f"internal error: {type(error).__name__}: {error}"


# ---------------------------------------------------------------- OpenAI fields attnserve does not take (400)

STREAM_OPTIONS = "stream_options is only allowed with stream: true"
PROMPT_LOGPROBS_STREAM = "prompt_logprobs are not available when stream is true"
SUFFIX = "suffix is not supported"
ECHO_LOGPROBS = "echo with logprobs is not supported; ask for prompt_logprobs instead"
TOKENIZE_PROMPT_AND_MESSAGES = "prompt: not allowed with messages (a /tokenize request has one or the other)"
BODY_NOT_OBJECT = "the request body must be a JSON object"
GUIDED_WHITESPACE = (
    "guided_whitespace_pattern is not supported (supported: absent or null; "
    "structured_outputs.disable_any_whitespace gives compact JSON)"
)
JSON_SCHEMA_MISSING = "response_format type 'json_schema' needs a json_schema object"


def best_of(value: int, n: int) -> str:
    return f"best_of {value} not supported: it must equal n ({n})"


def guided_backend(name: object) -> str:
    return f"guided_decoding_backend {name!r} is not supported (supported: 'xgrammar', 'auto')"


def two_constraints(first: str, second: str) -> str:
    """Two output constraints in one request (``response_format`` and ``guided_json``, ...)."""
    return f"{second} together with {first}: a request takes one output constraint"


def vllm_field(name: str, value: object, allowed: str) -> Refusal:
    """A vLLM request field attnserve does not implement, set to a value that would change what runs."""
    return Refusal((name,), value, allowed, written=JSON, advice=f"attnserve does not implement vLLM's {name}")


CONTINUOUS_USAGE_STATS = Refusal(
    ("stream_options", "continuous_usage_stats"),
    True,
    "false, or null",
    written=JSON,
    advice="attnserve does not implement vLLM's continuous_usage_stats; include_usage puts the usage in the last chunk",
)
"""vLLM's ``stream_options.continuous_usage_stats: true`` (the usage in every chunk)."""


def logit_bias_key(key: str) -> Refusal:
    return Refusal(("logit_bias", key), key, "token ids (decimal integers) as keys")


# ---------------------------------------------------------------- a request's lists over the server's limits (limits.py)


def string_too_long(path: tuple[str | int, ...], length: int, limit: int) -> Refusal:
    return Refusal(path, reason=f"is a string of {length} characters", allowed=f"at most {limit} characters")


def too_many(path: tuple[str | int, ...], count: int, limit: int, what: str) -> Refusal:
    return Refusal(path, reason=f"has {count} items", allowed=f"at most {limit} {what}")


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
