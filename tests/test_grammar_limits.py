"""A constraint is proved before it is admitted, and fails alone if it fails later: the
limits of `llmengine.structured.limits` are 400s that name them, a grammar that breaks one
after admission fails its own request and leaves the cache, and no request ends "stop" on
output its grammar has not completed."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest
from server_helpers import MODEL_NAME, TIMEOUT, Served, served, sse_payloads, wait_until

import llmengine
from llmengine.params import SamplingParams
from llmengine.structured.constraint import Constraint
from llmengine.structured.limits import MAX_ITEMS_IN_ROW, STEP_LEXER_FUEL


def alternatives(count: int, prefix: str = "w") -> str:
    return " | ".join(f'"{prefix}{index}"' for index in range(count))


WIDE_RULE = "start: " + alternatives(5_000)  # 40 KB, under the 100,000-character cap
NESTED_RULES = f"start: a | b\na: {alternatives(2_500)}\nb: {alternatives(2_500, 'v')}"
EXPANDED_REGEX = "(x{1000}){1000}"
# Passes the proof (its first tokens are inside the literal) and breaks the row limit at the
# alternation, a dozen tokens in.
LATE_WIDE_RULE = f'start: "zzzzzzzzzzzz" big\nbig: {alternatives(3_000)}'
PATHOLOGICAL = [
    ({"temperature": 1e39, "structured_outputs": {"choice": ["aye", "nay"]}}, "temperature"),
    ({"structured_outputs": {"grammar": WIDE_RULE}}, f"more than the {MAX_ITEMS_IN_ROW} allowed"),
    ({"structured_outputs": {"regex": EXPANDED_REGEX}}, f"lexer fuel, {STEP_LEXER_FUEL}"),
]


@pytest.fixture(scope="module")
def server(model: llmengine.Llama, tokenizer: Any):
    with served(llmengine.Engine(model, num_blocks=256, num_slots=8), tokenizer) as running:
        yield running


def complete(server: Served, **fields: Any) -> httpx.Response:
    body = {"model": MODEL_NAME, "prompt": "ROMEO:", "max_tokens": 8, **fields}
    return server.post("/v1/completions", body)


@pytest.mark.parametrize(("fields", "named"), PATHOLOGICAL)
def test_each_pathological_constraint_is_a_400_naming_the_limit_every_time(
    server: Served, fields: dict, named: str
) -> None:
    compiled = server.engine.runner.grammar_compiler.num_compiled
    for _ in range(2):  # the second time too: nothing broken was cached the first
        response = complete(server, **fields)
        assert response.status_code == 400, response.text
        assert named in response.json()["error"]["message"]
    assert server.engine.runner.grammar_compiler.num_compiled == compiled


def test_rules_that_together_open_too_many_alternatives_are_refused(server: Served) -> None:
    response = complete(server, structured_outputs={"grammar": NESTED_RULES})
    assert response.status_code == 400
    assert f"more than the {MAX_ITEMS_IN_ROW} allowed" in response.json()["error"]["message"]
    as_terminal = "start: W\nW: " + alternatives(5_000)  # what the message advises: one lexeme
    response = complete(server, structured_outputs={"grammar": as_terminal}, temperature=0)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"] in {f"w{index}" for index in range(5_000)}


@pytest.mark.parametrize("stop", [{"stop": ["a"]}, {"stop_token_ids": [5]}])
def test_a_stop_with_a_constraint_is_a_400(server: Served, stop: dict) -> None:
    response = complete(server, structured_outputs={"regex": "[a-z]+"}, **stop)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == next(iter(stop))


def run_alone(engine: llmengine.Engine, prompt: list[int], params: SamplingParams) -> list[int]:
    request_id = engine.add_request(prompt, params)
    while engine.has_unfinished():
        engine.step()
    return engine.release(request_id).output_token_ids


def test_a_grammar_that_breaks_a_limit_late_fails_alone_and_leaves_the_cache(
    model: llmengine.Llama, tokenizer: Any
) -> None:
    engine = llmengine.Engine(model, tokenizer=tokenizer, num_blocks=64, num_slots=4)
    greedy = SamplingParams(max_tokens=40, ignore_eos=True)
    prompt = tokenizer.encode("JULIET:")
    alone = run_alone(engine, prompt, greedy)
    late = Constraint.grammar(LATE_WIDE_RULE)
    doomed = engine.add_request(
        tokenizer.encode("ROMEO:"), SamplingParams(max_tokens=30, constraint=late)
    )
    other = engine.add_request(prompt, greedy)
    assert engine.runner.grammar_compiler.num_compiled == 1  # it passed the proof
    failed: dict[int, str] = {}
    while engine.has_unfinished():
        failed.update(engine.step().failed)
    assert list(failed) == [doomed]
    assert f"more than the {MAX_ITEMS_IN_ROW} allowed" in failed[doomed]
    assert engine.release(other).output_token_ids == alone
    assert engine.runner.grammar_compiler.num_compiled == 0


def test_a_stop_token_before_the_grammar_is_complete_fails_the_request(
    model: llmengine.Llama, tokenizer: Any
) -> None:
    """The choice forces its tokens; making the second one a stop token would end the output
    at "ay" with finish_reason "stop", which is not one of the choices: it fails instead."""
    engine = llmengine.Engine(model, tokenizer=tokenizer, num_blocks=64, num_slots=4)
    prompt = tokenizer.encode("ROMEO:")
    choice = Constraint.choice(["aye nay"])
    forced = run_alone(engine, prompt, SamplingParams(max_tokens=10, constraint=choice))
    assert tokenizer.decode(forced, skip_special_tokens=True) == "aye nay" and len(forced) > 2
    params = SamplingParams(max_tokens=10, constraint=choice, stop_token_ids=(forced[1],))
    request_id = engine.add_request(prompt, params)
    failed: dict[int, str] = {}
    while engine.has_unfinished():
        failed.update(engine.step().failed)
    assert "its grammar has not completed" in failed[request_id]
    assert engine.release(request_id).finish_reason is None


def stream_text(url: str, body: dict) -> str:
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True},
                      timeout=TIMEOUT) as response:  # fmt: skip
        assert response.status_code == 200
        payloads = sse_payloads(response.iter_lines())
    assert not [payload for payload in payloads if "error" in payload]
    return "".join(payload["choices"][0]["text"] for payload in payloads if payload["choices"])


def test_pathological_constraints_next_to_six_streams_leave_them_exact(server: Served) -> None:
    """Six greedy streams run while each pathological constraint (and one that breaks a limit
    only inside the step) is sent: each gets its 400 or fails alone, and every stream's text
    equals its lone run."""
    streams = [{"model": MODEL_NAME, "prompt": f"ROMEO {index}:", "max_tokens": 200,
                "temperature": 0, "ignore_eos": True} for index in range(6)]  # fmt: skip
    alone = [stream_text(server.url, body) for body in streams]
    texts: list[str | None] = [None] * len(streams)

    def run(index: int) -> None:
        texts[index] = stream_text(server.url, streams[index])

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(streams))]
    for thread in threads:
        thread.start()
    assert wait_until(lambda: server.engine.num_running == len(streams))
    late = complete(server, structured_outputs={"grammar": LATE_WIDE_RULE}, max_tokens=30)
    # It failed a dozen steps after it joined them; the streams need 200 steps in all.
    assert all(thread.is_alive() for thread in threads)
    statuses = [complete(server, **fields).status_code for fields, _ in PATHOLOGICAL]
    for thread in threads:
        thread.join(timeout=60)
    assert statuses == [400] * len(PATHOLOGICAL)
    assert late.status_code == 500, late.text
    assert f"more than the {MAX_ITEMS_IN_ROW} allowed" in late.json()["error"]["message"]
    assert texts == alone


def test_a_stream_whose_grammar_breaks_late_ends_with_an_error_event(server: Served) -> None:
    body = {"model": MODEL_NAME, "prompt": "ROMEO:", "max_tokens": 30, "stream": True,
            "structured_outputs": {"grammar": LATE_WIDE_RULE}}  # fmt: skip
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=TIMEOUT) as sse:
        assert sse.status_code == 200
        payloads = sse_payloads(sse.iter_lines())  # ends with [DONE]
    errors = [payload["error"] for payload in payloads if "error" in payload]
    assert len(errors) == 1 and f"more than the {MAX_ITEMS_IN_ROW} allowed" in errors[0]["message"]
    finishes = [c["finish_reason"] for p in payloads for c in p.get("choices", [])]
    assert "stop" not in finishes
