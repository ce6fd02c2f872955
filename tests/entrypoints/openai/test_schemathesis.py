"""Property-based fuzzing of the live server from its own OpenAPI schema: no input makes it answer 5xx.

Generated bodies are capped in cost before they are sent (max_tokens <= 2, n <= 2, at most 2 prompts), so
that the run stays in CPU budget; the values stay schema-valid (or stay invalid when they were)."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

schema = schemathesis.pytest.from_fixture("openapi_schema")


@pytest.fixture(scope="module")
def openapi_schema(server):
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    # the coverage phase sends hundreds of boundary-value bodies: too many model runs for a CPU test
    schema.config.phases.update(phases=["examples", "fuzzing"])
    return schema


def _cap_cost(body) -> None:
    if not isinstance(body, dict):
        return
    for key in ("max_tokens", "max_completion_tokens"):
        if isinstance(body.get(key), int) and not isinstance(body[key], bool) and body[key] > 2:
            body[key] = 2
    if "messages" in body and body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = 2  # chat's default is "the rest of the context"
    if "prompt" in body and "max_tokens" in body and body["max_tokens"] is None:
        body["max_tokens"] = 2
    for key in ("n", "best_of"):
        if isinstance(body.get(key), int) and not isinstance(body[key], bool) and body[key] > 2:
            body[key] = 2
    if isinstance(body.get("prompt"), list) and body["prompt"] and isinstance(body["prompt"][0], (str, list)):
        body["prompt"] = body["prompt"][:2]


@schema.parametrize()
@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case, server):
    _cap_cost(case.body)
    response = case.call(base_url=server.url, timeout=120)
    assert response.status_code < 500, (
        f"{case.method} {case.path} {case.body!r} -> {response.status_code} {response.text}"
    )
