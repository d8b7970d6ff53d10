"""Structured output over HTTP: response_format, vLLM's structured_outputs and tool calls,
through the openai client, LangChain and plain HTTP, streamed and not."""

from __future__ import annotations

import json
import re
from typing import Literal

import httpx
import jsonschema
import pytest
from pydantic import BaseModel, Field
from server_helpers import MODEL_NAME, Served, scripted, served, sse_payloads, streamed_message

import llmengine

SPEECH = [{"role": "user", "content": "Who art thou?"}]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "mood": {"enum": ["merry", "sad", "wroth"]},
    },
    "required": ["name", "age", "mood"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
SWORD = {
    "type": "function",
    "function": {
        "name": "draw_sword",
        "parameters": {
            "type": "object",
            "properties": {"times": {"type": "integer", "minimum": 1, "maximum": 3}},
            "required": ["times"],
            "additionalProperties": False,
        },
    },
}


class Character(BaseModel):
    name: str = Field(max_length=16)
    age: int = Field(ge=0, le=120)
    mood: Literal["merry", "sad", "wroth"]


@pytest.fixture(scope="module")
def server(model, tokenizer):
    with served(llmengine.Engine(model, num_blocks=128, num_slots=8), tokenizer) as running:
        yield running


def chat(server: Served, **fields) -> dict:
    body = {"model": MODEL_NAME, "messages": SPEECH, "temperature": 0, "max_tokens": 80}
    response = server.post("/v1/chat/completions", {**body, **fields})
    assert response.status_code == 200, response.text
    return response.json()


def test_the_openai_clients_parse_gets_an_instance_of_the_model(server: Served) -> None:
    completion = server.openai().chat.completions.parse(
        model=MODEL_NAME, messages=SPEECH, response_format=Character, temperature=0, max_tokens=80
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Character)
    assert choice.message.parsed == Character.model_validate_json(choice.message.content)


def test_langchains_with_structured_output_gets_an_instance(server: Served) -> None:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        model=MODEL_NAME, base_url=f"{server.url}/v1", api_key="unused", temperature=0,
        max_tokens=80, max_retries=0, timeout=30,
    )  # fmt: skip
    # strict: without it LangChain's schema leaves additionalProperties open, and a model
    # that never saw JSON then writes an extra key until max_tokens.
    for method in ("json_schema", "function_calling"):
        structured = llm.with_structured_output(Character, method=method, strict=True)
        assert isinstance(structured.invoke("Who art thou?"), Character), method


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_and_json_object_responses_parse(server: Served, stream: bool) -> None:
    client = server.openai()
    formats = [
        {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
        {"type": "json_object"},
    ]
    for response_format in formats:
        fields = {"model": MODEL_NAME, "messages": SPEECH, "temperature": 0, "max_tokens": 80}
        if stream:
            chunks = client.chat.completions.create(
                **fields, response_format=response_format, stream=True
            )
            text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
        else:
            completion = client.chat.completions.create(**fields, response_format=response_format)
            text = completion.choices[0].message.content
        assert text.startswith("{")
        if response_format["type"] == "json_schema":
            jsonschema.validate(json.loads(text), PERSON)


def test_a_required_tool_call_parses_into_the_tools_arguments(server: Served) -> None:
    completion = server.openai().chat.completions.create(
        model=MODEL_NAME, messages=SPEECH, tools=[WEATHER, SWORD], tool_choice="required",
        parallel_tool_calls=False, temperature=0, max_tokens=80,
    )  # fmt: skip
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    tool = {"get_weather": WEATHER, "draw_sword": SWORD}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    assert re.fullmatch(r"call_[0-9a-f]{24}", call.id)


def test_a_named_function_is_called_streamed_or_not(server: Served) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    whole = chat(server, tools=[WEATHER, SWORD], tool_choice=named)["choices"][0]
    assert whole["finish_reason"] == "tool_calls"
    (call,) = whole["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    arguments = json.loads(call["function"]["arguments"])
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])
    body = {"model": MODEL_NAME, "messages": SPEECH, "temperature": 0, "max_tokens": 80}
    body.update(tools=[WEATHER, SWORD], tool_choice=named, stream=True)
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=30) as sse:
        payloads = sse_payloads(sse.iter_lines())
    content, calls, reason = streamed_message(payloads)
    assert content == "" and reason == "tool_calls"
    assert calls == [{"name": "get_weather", "arguments": call["function"]["arguments"]}]
    # The arguments arrive piece by piece as they are generated, not whole at the end.
    pieces = [c for p in payloads for c in p["choices"][0]["delta"].get("tool_calls", [])]
    assert len(pieces) > 2


def test_auto_and_none_answer_in_text(server: Served) -> None:
    plain = chat(server)["choices"][0]["message"]["content"]
    for tool_choice in ("auto", "none", None):
        fields = {"tools": [WEATHER]} | (
            {} if tool_choice is None else {"tool_choice": tool_choice}
        )
        choice = chat(server, **fields)["choices"][0]
        assert choice["message"] == {"role": "assistant", "content": plain}
        assert choice["finish_reason"] in ("stop", "length")


def test_without_a_tool_call_parser_a_call_the_model_writes_is_text(server: Served) -> None:
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Verona"}}\n</tool_call>'
    for fields in ({"tool_choice": "auto"}, {}):
        choice = chat(server, tools=[WEATHER], **fields, **scripted(text))["choices"][0]
        assert choice["message"] == {"role": "assistant", "content": text}
        assert choice["finish_reason"] == "stop"


def test_a_tool_call_cut_short_by_max_tokens_comes_back_as_text(server: Served) -> None:
    choice = chat(server, tools=[WEATHER], tool_choice="required", max_tokens=5)["choices"][0]
    assert choice["finish_reason"] == "length"
    assert "tool_calls" not in choice["message"]
    content = choice["message"]["content"]
    assert content and '[{"name":"get_weather","arguments":{"city":"'.startswith(content)


def test_a_conversation_with_a_tool_call_and_its_answer_goes_on(server: Served) -> None:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Verona"}'}}  # fmt: skip
    messages = [
        *SPEECH,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Rain"},
    ]
    choice = chat(server, messages=messages, tools=[WEATHER])["choices"][0]
    assert choice["message"]["content"]


@pytest.mark.parametrize(
    ("structured", "matches"),
    [
        ({"regex": r"(Good|Ill) (morrow|night)\."}, r"(Good|Ill) (morrow|night)\."),
        ({"choice": ["aye", "nay"]}, r"aye|nay"),
        ({"grammar": 'start: "O " NAME "!"\nNAME: /[A-Z][a-z]{1,8}/'}, r"O [A-Z][a-z]{1,8}!"),
        ({"json": PERSON}, None),
    ],
)
def test_structured_outputs_constrain_completions(server: Served, structured, matches) -> None:
    body = {"model": MODEL_NAME, "prompt": "ROMEO:\n", "max_tokens": 80, "temperature": 0, "n": 2,
            "seed": 3, "structured_outputs": structured}  # fmt: skip
    for temperature in (0, 0.9):
        response = server.post("/v1/completions", {**body, "temperature": temperature})
        assert response.status_code == 200, response.text
        for choice in response.json()["choices"]:
            assert choice["finish_reason"] == "stop"
            if matches is None:
                jsonschema.validate(json.loads(choice["text"]), PERSON)
            else:
                assert re.fullmatch(matches, choice["text"]), choice["text"]


def test_a_schema_that_does_not_compile_is_a_400_naming_the_problem(server: Served) -> None:
    bad = {"type": "json_schema", "json_schema": {"name": "s", "schema": {"$ref": "#/nowhere"}}}
    response = server.post("/v1/chat/completions", {"messages": SPEECH, "response_format": bad})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "response_format" and "/nowhere" in error["message"]
    tool = {**WEATHER, "function": {**WEATHER["function"], "parameters": {"type": "nope"}}}
    response = server.post(
        "/v1/chat/completions", {"messages": SPEECH, "tools": [tool], "tool_choice": "required"}
    )
    assert response.status_code == 400 and response.json()["error"]["param"] == "tools"


SCHEMAS = [
    PERSON,
    WEATHER["function"]["parameters"],
    {
        "type": "object",
        "properties": {
            "lines": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 2},
            "act": {"type": "integer", "minimum": 1, "maximum": 5},
        },
        "required": ["lines", "act"],
        "additionalProperties": False,
    },
    {"type": "object", "properties": {"verdict": {"type": "boolean"}}, "required": ["verdict"],
     "additionalProperties": False},
]  # fmt: skip


def test_two_hundred_mixed_requests_in_a_cramped_pool_all_fit_their_schemas(
    model, tokenizer
) -> None:
    """200 requests, four schemas, streamed and not, greedy and seeded, 16 at a time into a
    pool that holds about two of them at full length: every answer validates, and the pool
    did preempt on the way."""
    from concurrent.futures import ThreadPoolExecutor

    engine = llmengine.Engine(model, num_blocks=24, block_size=8, num_slots=8)

    def ask(index: int) -> tuple[dict, str, str | None]:
        schema = SCHEMAS[index % len(SCHEMAS)]
        body = {
            "model": MODEL_NAME, "messages": [{"role": "user", "content": f"Speak, {index}."}],
            "max_tokens": 96, "temperature": 0.8 if index % 3 else 0, "seed": index,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": f"s{index % 4}", "schema": schema}},
        }  # fmt: skip
        if index % 2:
            url = f"{server.url}/v1/chat/completions"
            with httpx.stream("POST", url, json={**body, "stream": True}, timeout=60) as sse:
                assert sse.status_code == 200
                choices = [p["choices"][0] for p in sse_payloads(sse.iter_lines())]
            text = "".join(c["delta"].get("content", "") for c in choices)
            return schema, text, choices[-1]["finish_reason"]
        response = server.post("/v1/chat/completions", body)
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        return schema, choice["message"]["content"], choice["finish_reason"]

    with served(engine, tokenizer) as server, ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(ask, range(200)))
        preemptions = server.metrics()["llmengine_preemptions_total"]
    for schema, text, finish_reason in answers:
        assert finish_reason == "stop", text
        jsonschema.validate(json.loads(text), schema)
    assert preemptions > 0
