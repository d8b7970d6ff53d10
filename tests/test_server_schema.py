"""The OpenAPI document tells the truth: a bounded schemathesis run against a live server
finds no 5xx, no hang, and every response matching its documented status, content type and
schema; and the document itself says 400 (never 422), serves /docs, and names /metrics text."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import checks
from server_helpers import Served, served

import llmengine


@pytest.fixture(scope="module")
def live(model: llmengine.Llama, tokenizer: Any) -> Iterator[Served]:
    # A small pool and queue: long generations and big `n` are refused at once, not run.
    engine = llmengine.Engine(model, num_blocks=8, block_size=16, num_slots=4)
    with served(engine, tokenizer, max_waiting=4) as running:
        yield running


OPERATIONS = [
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/{model_id}"),
    ("GET", "/health"),
    ("GET", "/metrics"),
]
EXAMPLES = 12  # per operation: bounded, so the run stays a few seconds each
# Not `positive_data_acceptance`: a request the schema allows may still ask for more than this
# model and pool can hold (its length, its n), which is a documented 400.
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
    checks.response_headers_conformance,
]


@pytest.mark.parametrize(("method", "path"), OPERATIONS)
def test_every_documented_response_is_what_comes_back(live: Served, method: str, path: str) -> None:
    """schemathesis draws requests from the document (valid ones and broken ones) and checks
    each response: no 5xx, and status, content type and body as documented."""
    api = schemathesis.openapi.from_url(f"{live.url}/openapi.json")
    operation = api[path][method]

    @given(case=operation.as_strategy())
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    def check(case: Any) -> None:
        case.call_and_validate(timeout=30, checks=CHECKS)

    check()


def test_the_document_says_400_and_serves_docs(live: Served) -> None:
    document = httpx.get(f"{live.url}/openapi.json").json()
    for path in ("/v1/completions", "/v1/chat/completions"):
        responses = document["paths"][path]["post"]["responses"]
        assert "422" not in responses and "400" in responses and "429" in responses
        assert "text/event-stream" in responses["200"]["content"]
    assert "text/plain" in document["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert httpx.get(f"{live.url}/docs").status_code == 200
