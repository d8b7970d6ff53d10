"""Tool calls as tool-trained checkpoints write them, over HTTP: `--tool-call-parser` hermes
and llama3_json, each behind its checkpoint's real chat template (tests/data).

The embedded model was never trained on tools, so its output is scripted: a regex
`structured_outputs` that matches only one text forces, under greedy decoding, exactly what
a Hermes or Llama model would write. The model gets the embedded weights with room for the
templates' long system prompts (its RoPE has no table to outgrow).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import httpx
import pytest
from server_helpers import (
    MODEL_NAME,
    Served,
    scripted,
    served,
    sse_payloads,
    streamed_message,
)

import llmengine
from llmengine.cli import build_parser
from llmengine.server import create_app
from llmengine.server.chat import ChatFormatter

TEMPLATES = Path(__file__).parent / "data"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "the city"}},
            "required": ["city"],
        },
    },
}
SWORD = {  # a call whose arguments are short whatever the model: required calls end
    "type": "function",
    "function": {
        "name": "draw_sword",
        "description": "Draw one's sword",
        "parameters": {
            "type": "object",
            "properties": {"times": {"type": "integer", "minimum": 1, "maximum": 3}},
            "required": ["times"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Verona?"}]
# Per format: its template, and what such a model writes to call get_weather.
FORMATS = {
    "hermes": (
        "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Verona"}}\n'
        "</tool_call>",
        "Let me look.",
    ),
    "llama3_json": (
        "meta-llama-Llama-3.2-3B-Instruct.jinja",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Verona"}}',
        None,
    ),
}


@pytest.fixture(scope="module")
def roomy_model(model):
    """The embedded weights with 2048 positions: the templates' prompts pass 512."""
    config = dataclasses.replace(model.config, max_position_embeddings=2048)
    roomy = llmengine.Llama(config)
    roomy.load_state_dict(model.state_dict())
    return roomy.eval()


@pytest.fixture(scope="module", params=sorted(FORMATS))
def fmt(request) -> str:
    """The tool-call format (a `--tool-call-parser` name) the server reads."""
    return request.param


@pytest.fixture(scope="module")
def server(fmt, roomy_model, tokenizer):
    template = (TEMPLATES / FORMATS[fmt][0]).read_text()
    engine = llmengine.Engine(roomy_model, num_blocks=160, num_slots=4)
    with served(engine, tokenizer, chat_template=template, tool_call_parser=fmt) as running:
        yield running


def chat(server: Served, **fields) -> dict:
    body = {"model": MODEL_NAME, "messages": ASK, "tools": [WEATHER], **fields}
    response = server.post("/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    return response.json()


def stream(server: Served, **fields) -> list:
    body = {"model": MODEL_NAME, "messages": ASK, "tools": [WEATHER], "stream": True, **fields}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=30) as sse:
        assert sse.status_code == 200
        return sse_payloads(sse.iter_lines())


def test_the_templates_show_the_model_its_tools_and_their_results(tokenizer) -> None:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Verona"}'}}  # fmt: skip
    conversation = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "Rain"}]  # fmt: skip
    expected = {
        "hermes": [
            '<tools> {"type": "function", "function": {"name": "get_weather", ',
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Verona"}}\n</tool_call>',
            "<|im_start|>tool\n<tool_response>\nRain\n</tool_response><|im_end|>",
        ],
        "llama3_json": [
            'Respond in the format {"name": function name, "parameters": dictionary',
            '    "function": {\n        "description": "The weather in a city",',
            '{"name": "get_weather", "parameters": {"city": "Verona"}}<|eot_id|>',
            # A string is iterable to Jinja: this template writes a tool's answer as JSON.
            '<|start_header_id|>ipython<|end_header_id|>\n\n"Rain"<|eot_id|>',
        ],
    }
    ends = {"hermes": "<|im_start|>assistant\n", "llama3_json": "<|end_header_id|>\n\n"}
    for name, (template, _, _) in FORMATS.items():
        formatter = ChatFormatter(tokenizer, (TEMPLATES / template).read_text())
        prompt = tokenizer.decode(formatter.token_ids(conversation, [WEATHER]))
        for part in expected[name]:
            assert part in prompt, (name, part)
        assert prompt.endswith(ends[name])


def test_auto_returns_the_call_the_model_wrote(server: Served, fmt: str) -> None:
    _, output, content = FORMATS[fmt]
    for tool_choice in ({"tool_choice": "auto"}, {}):  # no tool_choice means auto
        choice = chat(server, **tool_choice, **scripted(output))["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        assert choice["message"]["content"] == content
        (call,) = choice["message"]["tool_calls"]
        assert call["type"] == "function" and call["id"].startswith("call_")
        assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Verona"}'}


def test_a_streamed_call_arrives_name_first_then_its_arguments(server: Served, fmt: str) -> None:
    _, output, content = FORMATS[fmt]
    options = {"logprobs": True, "stream_options": {"include_usage": True}}
    payloads = stream(server, **options, **scripted(output))
    assert streamed_message(payloads) == (
        content or "",
        [{"name": "get_weather", "arguments": '{"city": "Verona"}'}],
        "tool_calls",
    )
    deltas = [choice["delta"] for payload in payloads for choice in payload["choices"]]
    pieces = [call for delta in deltas for call in delta.get("tool_calls", [])]
    assert len(pieces) > 2  # the arguments came in several pieces
    sent = "".join(delta.get("content") or "" for delta in deltas)
    assert "<" not in sent and "{" not in sent  # no part of a call leaked as content
    # Every token's logprob is sent once, held text's with the chunk that sends it.
    scored = [c["logprobs"]["content"] for p in payloads for c in p["choices"] if c["logprobs"]]
    assert sum(map(len, scored)) == payloads[-1]["usage"]["completion_tokens"]


def test_the_openai_client_puts_a_streamed_call_together(server: Served, fmt: str) -> None:
    _, output, content = FORMATS[fmt]
    client = server.openai()
    fields = {"model": MODEL_NAME, "messages": ASK, "tools": [WEATHER], "temperature": 0}
    with client.chat.completions.stream(
        **fields,
        max_tokens=200,
        extra_body={"structured_outputs": scripted(output)["structured_outputs"]},
    ) as events:
        final = events.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert (choice.message.content or None) == content
    (call,) = choice.message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_weather", '{"city": "Verona"}')
    # A required call's stream, from the constrained list, puts together the same way.
    fields.update(tools=[SWORD], tool_choice="required", parallel_tool_calls=False)
    with client.chat.completions.stream(**fields, max_tokens=80) as events:
        required = events.get_final_completion().choices[0]
    whole = client.chat.completions.create(**fields, max_tokens=80).choices[0]
    assert required.finish_reason == whole.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in required.message.tool_calls] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls
    ]


def test_an_output_with_no_call_is_content(server: Served) -> None:
    text = "Rain, and more rain.\n"
    choice = chat(server, **scripted(text))["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": text}
    assert choice["finish_reason"] == "stop"
    assert streamed_message(stream(server, **scripted(text))) == (text, [], "stop")


def test_tool_choice_none_leaves_a_call_as_text(server: Served, fmt: str) -> None:
    _, output, _ = FORMATS[fmt]
    choice = chat(server, tool_choice="none", **scripted(output))["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": output}
    assert choice["finish_reason"] == "stop"


def test_a_tool_result_goes_back_and_the_model_answers(server: Served, fmt: str) -> None:
    _, output, _ = FORMATS[fmt]
    first = chat(server, **scripted(output))["choices"][0]["message"]
    (call,) = first["tool_calls"]
    messages = [*ASK, first, {"role": "tool", "tool_call_id": call["id"], "content": "Rain"}]
    answer = "It rains in Verona."
    choice = chat(server, messages=messages, **scripted(answer))["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": answer}
    assert choice["finish_reason"] == "stop"


def test_a_call_cut_short_is_text_whole_and_pieces_streamed(server: Served, fmt: str) -> None:
    _, output, _ = FORMATS[fmt]
    # Cut where the arguments have begun: after the token that writes Verona's V, as the
    # whole output's tokens (its logprobs) show.
    full = chat(server, logprobs=True, **scripted(output))["choices"][0]
    tokens = [entry["token"] for entry in full["logprobs"]["content"]]
    written = [sum(map(len, tokens[:count])) for count in range(len(tokens) + 1)]
    budget = next(count for count, length in enumerate(written) if length > output.index("Verona"))
    cut = {**scripted(output), "max_tokens": budget}
    choice = chat(server, **cut)["choices"][0]
    assert choice["finish_reason"] == "length"
    assert "tool_calls" not in choice["message"]
    text = choice["message"]["content"]
    assert output.startswith(text) and '{"city": "V' in text
    content, calls, reason = streamed_message(stream(server, **cut))
    assert reason == "length" and [c["name"] for c in calls] == ["get_weather"]
    assert '{"city": "V' in calls[0]["arguments"]
    assert '{"city": "Verona"}'.startswith(calls[0]["arguments"])


def test_the_parser_is_a_serve_option_and_an_unknown_one_is_refused(model, tokenizer) -> None:
    assert build_parser().parse_args(["serve"]).tool_call_parser is None
    args = build_parser().parse_args(["serve", "--tool-call-parser", "llama3_json"])
    assert args.tool_call_parser == "llama3_json"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--tool-call-parser", "mistral"])
    engine = llmengine.Engine(model, num_blocks=8, num_slots=1)
    with pytest.raises(ValueError, match="unknown tool-call parser 'mistral'"):
        create_app(engine, tokenizer, served_model_name="m", tool_call_parser="mistral")
