"""Structured outputs with the default model on CPU: JSON schemas, regex, choice, grammar; the mask leaves
unconstrained requests of the same batch alone; max_tokens inside a value is ``length``; bad constraints refused."""

from __future__ import annotations

import contextlib
import json
import re

import pytest

from attnserve.core.sampling_params import SamplingParams
from attnserve.core.structured_outputs import StructuredOutputsParams as S
from attnserve.refusals import Refused
from tests.structured_output.schemas import PROMPTS, SCHEMAS

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")


@contextlib.contextmanager
def with_async_scheduling(engine, on: bool = True):
    """The shared engine with async scheduling ``on`` for the block (restored after it)."""
    was = engine.async_scheduling
    engine.async_scheduling = on
    try:
        yield engine
    finally:
        engine.async_scheduling = was


def test_fifty_generations_against_ten_json_schemas_validate(default_llm):
    """One batch: 5 per schema (the first greedy, then sampled with seeds), every output parses and validates."""
    prompts, params, which = [], [], []
    for i in range(50):
        k = i % 10
        prompts.append(PROMPTS[k])
        which.append(k)
        params.append(
            SamplingParams(
                temperature=0.0 if i < 10 else 0.8,
                seed=i,
                max_tokens=100,
                structured_outputs=S(json=SCHEMAS[k], disable_any_whitespace=True),
            )
        )
    outs = default_llm.generate(prompts, params)
    for k, out in zip(which, outs):
        c = out.outputs[0]
        assert c.finish_reason == "stop", (k, c.text)
        jsonschema.validate(json.loads(c.text), SCHEMAS[k])


def test_regex_choice_grammar_and_json_object(default_llm):
    regexes = [r"\d{3}-\d{4}", r"(cat|dog)s? [a-z]{2,5}", r"[A-Z][a-z]+, [A-Z]{2}"]
    choices = ["alpha", "beta", "gamma delta"]
    grammar = 'root ::= "(" num "+" num ")"\nnum ::= [1-9] [0-9]?'
    params = (
        [SamplingParams(temperature=0.0, max_tokens=20, structured_outputs=S(regex=r)) for r in regexes]
        + [
            SamplingParams(temperature=1.0, seed=s, max_tokens=10, structured_outputs=S(choice=choices))
            for s in range(3)
        ]
        + [
            SamplingParams(temperature=0.0, max_tokens=30, structured_outputs=S(grammar=grammar)),
            SamplingParams(
                temperature=0.0, max_tokens=60, structured_outputs={"json_object": True, "disable_any_whitespace": True}
            ),
        ]
    )
    prompts = ["A phone number:", "Pets:", "A place:", "Pick one:", "Pick one:", "Pick one:", "A sum:", "JSON:"]
    outs = [o.outputs[0] for o in default_llm.generate(prompts, params)]
    for r, c in zip(regexes, outs[:3]):
        assert re.fullmatch(r, c.text) and c.finish_reason == "stop", (r, c.text)
    assert all(c.text in choices and c.finish_reason == "stop" for c in outs[3:6]), [c.text for c in outs[3:6]]
    assert re.fullmatch(r"\([1-9][0-9]?\+[1-9][0-9]?\)", outs[6].text), outs[6].text
    if outs[7].finish_reason == "stop":
        assert isinstance(json.loads(outs[7].text), dict)
    else:
        assert outs[7].text.startswith("{")


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_unconstrained_requests_get_the_tokens_they_get_alone(default_llm, async_scheduling):
    """Greedy unconstrained requests batched with constrained ones: the same tokens as alone (with async
    scheduling, steps of constrained requests run without overlap; the tokens are the same)."""
    with with_async_scheduling(default_llm.engine, async_scheduling):
        free = ["The capital of France is", "Once upon a time"]
        greedy = SamplingParams(temperature=0.0, max_tokens=12)
        alone = [o.outputs[0].token_ids for o in default_llm.generate(free, [greedy, greedy])]
        constrained = SamplingParams(
            temperature=0.0, max_tokens=40, structured_outputs=S(json=SCHEMAS[0], disable_any_whitespace=True)
        )
        mixed = default_llm.generate(
            [free[0], PROMPTS[0], free[1], PROMPTS[0]], [greedy, constrained, greedy, constrained]
        )
        assert [mixed[0].outputs[0].token_ids, mixed[2].outputs[0].token_ids] == alone
        for o in (mixed[1], mixed[3]):
            jsonschema.validate(json.loads(o.outputs[0].text), SCHEMAS[0])


def test_max_tokens_inside_a_constrained_value_is_length(default_llm):
    out = default_llm.generate(
        ["Describe a person as JSON."],
        SamplingParams(temperature=0.0, max_tokens=3, structured_outputs=S(json=SCHEMAS[0])),
    )[0].outputs[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 3 and out.text.startswith("{")


def test_n_completions_each_follow_the_constraint(default_llm):
    out = default_llm.generate(
        ["Pick a color and a count, as JSON."],
        SamplingParams(
            n=3,
            temperature=1.0,
            seed=7,
            max_tokens=40,
            structured_outputs=S(json=SCHEMAS[1], disable_any_whitespace=True),
        ),
    )[0]
    assert len(out.outputs) == 3
    for c in out.outputs:
        jsonschema.validate(json.loads(c.text), SCHEMAS[1])


@pytest.mark.parametrize(
    "params, path",
    [
        (S(json={"type": "objectx"}), ("structured_outputs", "json")),
        (S(regex="(("), ("structured_outputs", "regex")),
        (S(grammar="root ::= foo"), ("structured_outputs", "grammar")),
        # xgrammar compiles a schema's pattern without a lookahead (logging that it ignores it): refused instead
        (S(json={"type": "string", "pattern": "(?=a)b"}), ("structured_outputs", "json")),
        (
            S(json={"type": "object", "properties": {"w": {"type": "string", "pattern": r"\bw"}}}),
            ("structured_outputs", "json"),
        ),
    ],
    ids=["schema", "regex", "grammar", "schema_pattern_lookahead", "nested_pattern_word_boundary"],
)
def test_invalid_constraints_are_refused_before_queueing(default_llm, params, path):
    with pytest.raises(Refused) as e:
        default_llm.generate(["x"], SamplingParams(max_tokens=2, structured_outputs=params))
    assert e.value.path == path and "is not a valid" in str(e.value)
    assert not default_llm.engine.structured.matchers


def test_a_schema_with_supported_patterns_compiles(default_llm):
    schema = {
        "type": "object",
        "properties": {"id": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"}},
        "required": ["id"],
    }
    out = default_llm.generate(
        ["An id:"], SamplingParams(temperature=0, max_tokens=20, structured_outputs=S(json=schema))
    )
    jsonschema.validate(json.loads(out[0].outputs[0].text), schema)


def test_async_abort_while_the_next_step_is_scheduled_ahead(default_llm):
    """Async scheduling with constrained requests plans step k+2 before step k+1 samples: a request aborted
    between two steps leaves that plan; the others run on and validate."""
    with with_async_scheduling(default_llm.engine) as engine:
        params = SamplingParams(
            temperature=0.0, max_tokens=40, structured_outputs=S(json=SCHEMAS[0], disable_any_whitespace=True)
        )
        ids = [engine.add_request(PROMPTS[0], params) for _ in range(3)]
        finished, aborted, prepared = {}, None, False
        steps = engine.structured_steps
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    finished[out.request_id] = out
            ahead = engine.runner._host_ahead  # the held plan's host batch, made ahead too
            prepared |= ahead is not None and ahead[0] is steps.scheduled_ahead
            if aborted is None and steps.scheduled_ahead is not None and len(steps.scheduled_ahead.requests) == 3:
                aborted = engine.abort_request(ids[1])
        assert prepared and aborted is not None and aborted.outputs[0].finish_reason == "abort"
        assert sorted(finished) == [ids[0], ids[2]] and not engine.structured.matchers
        for rid in (ids[0], ids[2]):
            jsonschema.validate(json.loads(finished[rid].outputs[0].text), SCHEMAS[0])


def test_a_grammar_ended_by_a_deferred_token_ends_with_the_next_token(default_llm):
    """Async scheduling accepts a step's tokens in the grammar's worker, after that step's outputs are made: a
    request whose deferred token ended its grammar (``take_ended``: a rejected token) finishes with its next
    token, and that output says so (finish reason stop); nothing is left behind."""
    with with_async_scheduling(default_llm.engine) as engine:
        params = SamplingParams(
            temperature=0.0, max_tokens=40, structured_outputs=S(json=SCHEMAS[0], disable_any_whitespace=True)
        )
        rid = engine.add_request(PROMPTS[0], params)
        outs = []
        for _ in range(4):
            outs += engine.step()
        (child,) = engine.output_processor.child_ids(rid)
        engine.structured_steps.ended_late.add(child)  # what a rejected deferred token leaves after the fill
        n = len(engine.scheduler.requests[child].output_token_ids)
        while engine.has_unfinished_requests():
            outs += engine.step()
        final = [o for o in outs if o.finished]
        assert len(final) == 1 and final[0].outputs[0].finish_reason == "stop"
        assert len(final[0].outputs[0].token_ids) == n + 1
        assert not engine.structured_steps.ended_late and not engine.structured.matchers
