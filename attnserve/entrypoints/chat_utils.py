"""Chat messages as the chat template sees them; shared by ``LLM.chat`` and ``/v1/chat/completions``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")  # protocol.ChatMessage.role's Literal
_CONTENT = "a string or a list of {'type': 'text', 'text': str} parts"


def chat_messages(messages: Sequence[Mapping]) -> list[dict]:
    """Validate OpenAI chat messages; returns ``{"role", "content": str[, "name"]}`` per message.

    Content is required whatever the role, as the server requires it (protocol.ChatMessage): OpenAI's API lets an
    assistant message go without it only when it carries tool calls, which attnserve has not; text parts
    ``{"type": "text", "text": str}`` are joined; an empty name is dropped; other keys are ignored. Raises
    ValueError naming the field by its path (``messages[0].content``), the value and what is allowed.
    """
    if isinstance(messages, (str, Mapping)) or not isinstance(messages, Sequence) or not messages:
        raise ValueError(f"messages {messages!r} not allowed (allowed: a non-empty list of message dicts)")
    return [_chat_message(i, m) for i, m in enumerate(messages)]


def _chat_message(i: int, m: Mapping) -> dict:
    if not isinstance(m, Mapping):
        raise ValueError(f"messages[{i}] {m!r} not allowed (allowed: a dict with 'role' and 'content')")
    for key, required in (("role", f"one of {list(CHAT_ROLES)}"), ("content", _CONTENT)):
        if key not in m:  # was, for content: read as "" (an empty message the user did not write)
            raise ValueError(f"messages[{i}].{key} missing (required: {required})")
    role, content, name = m["role"], m["content"], m.get("name")
    if role not in CHAT_ROLES:
        raise ValueError(f"messages[{i}].role {role!r} not allowed (allowed: one of {list(CHAT_ROLES)})")
    if not isinstance(content, str):
        ok = isinstance(content, Sequence) and all(
            isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content)
        if not ok:
            raise ValueError(f"messages[{i}].content {content!r} not allowed (allowed: {_CONTENT})")
        content = "".join(p["text"] for p in content)
    if name is not None and not isinstance(name, str):
        raise ValueError(f"messages[{i}].name {name!r} not allowed (allowed: a string or None)")
    return {"role": role, "content": content, **({"name": name} if name else {})}
