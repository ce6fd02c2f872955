"""The request's output constraint (structured outputs): ``response_format``, vLLM's ``structured_outputs`` or
one of the older ``guided_*`` fields, as one ``StructuredOutputsParams`` and the field that asked for it."""

from __future__ import annotations

import dataclasses

from attnserve.core.structured_outputs import StructuredOutputsParams
from attnserve.entrypoints.openai.errors import OpenAIError
from attnserve.entrypoints.openai.protocol import SamplingFields
from attnserve.entrypoints.openai.serving import refusal_error
from attnserve.refusals import Refused
from attnserve.refusals import serving as words

# the request fields that ask for structured outputs, each with the StructuredOutputsParams field it sets
GUIDED_FIELDS = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


def structured_outputs(req: SamplingFields) -> tuple[str, StructuredOutputsParams] | None:
    """The request's output constraint and the field that asked for it: ``response_format`` (``json_object``,
    ``json_schema``; ``text`` asks for none), ``structured_outputs`` or one of the older ``guided_*`` fields.
    None when there is none; 400 for two of them, or for a value StructuredOutputsParams refuses."""
    if req.guided_decoding_backend not in (None, "xgrammar", "auto"):
        raise OpenAIError(words.guided_backend(req.guided_decoding_backend), 400, param="guided_decoding_backend")
    if req.guided_whitespace_pattern is not None:
        raise OpenAIError(words.GUIDED_WHITESPACE, 400, param="guided_whitespace_pattern")
    asked: list[tuple[str, dict]] = []
    rf = req.response_format
    if rf is not None and rf.type == "json_object":
        asked.append(("response_format", {"json_object": True}))
    elif rf is not None and rf.type == "json_schema":
        if rf.json_schema is None:
            raise OpenAIError(words.JSON_SCHEMA_MISSING, 400, param="response_format.json_schema")
        schema = rf.json_schema.json_schema
        asked.append(("response_format", {"json": schema} if schema is not None else {"json_object": True}))
    if req.structured_outputs is not None:
        asked.append(("structured_outputs", req.structured_outputs))
    asked += [
        (name, {key: getattr(req, name)}) for name, key in GUIDED_FIELDS.items() if getattr(req, name) is not None
    ]
    if not asked:
        return None
    if len(asked) > 1:
        names = [name for name, _ in asked]
        raise OpenAIError(words.two_constraints(names[0], names[1]), 400, param=names[1])
    name, fields = asked[0]
    try:
        return name, StructuredOutputsParams.from_dict(fields)
    except Refused as e:
        refusal = e.refusal
        if name != "structured_outputs":  # the field the request used, not the record's
            refusal = dataclasses.replace(refusal, path=(name, *refusal.path[2:]))
        raise refusal_error(refusal) from None
