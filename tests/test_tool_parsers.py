"""The tool-call parsers on scripted model outputs: what they find in a finished output, and
that a stream cut into any pieces sends exactly that, holding back what may open a call."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from llmengine.server.tool_parsers import (
    HermesParser,
    Llama3JsonParser,
    NamedArguments,
    RequiredCalls,
)
from llmengine.server.tool_reader import ToolCall

HERMES = (
    "Let me look that up.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Verona", "days": [1, {"x": "}]"}]}}\n'
    "</tool_call>\n<tool_call>\n"
    '{"arguments": {"times": 2}, "name": "draw_sword"}\n</tool_call>\n'
)
LLAMA = (
    '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Verona"}}; '
    '{"type": "function", "name": "draw_sword", "parameters": {"times": 2}}'
)
# (the parser, an output, the content and calls it holds)
OUTPUTS: list[tuple[Callable, str, str | None, list[ToolCall]]] = [
    (HermesParser, HERMES, "Let me look that up.", [
        ToolCall("get_weather", '{"city": "Verona", "days": [1, {"x": "}]"}]}'),
        ToolCall("draw_sword", '{"times": 2}'),
    ]),
    (HermesParser, "No call here; <tool_call is only text.\n", None, []),
    (HermesParser, "<tool_call>not JSON</tool_call> then words", None, []),
    (HermesParser, 'a\n<tool_call>{"name": "f", "arguments": {}}</tool_call>\nb', "a\nb",
     [ToolCall("f", "{}")]),
    (Llama3JsonParser, LLAMA, None, [
        ToolCall("get_weather", '{"city": "Verona"}'), ToolCall("draw_sword", '{"times": 2}'),
    ]),
    (Llama3JsonParser, '{"name": "f", "parameters": {"a": "b"}}', None,
     [ToolCall("f", '{"a": "b"}')]),
    (Llama3JsonParser, '{"answer": 42}', None, []),
    (Llama3JsonParser, 'I think {"name": "f", "parameters": {}} fits.', None, []),
    (Llama3JsonParser, "  plain words\n", None, []),
    (RequiredCalls, '[{"name": "f", "arguments": {"a": [1]}}, {"name":"g","arguments":{}}]',
     None, [ToolCall("f", '{"a": [1]}'), ToolCall("g", "{}")]),
    (lambda: NamedArguments("f"), '{"city": "Verona"}', None,
     [ToolCall("f", '{"city": "Verona"}')]),
]  # fmt: skip


def streamed(make: Callable, text: str, size: int) -> tuple[str, list[ToolCall], list]:
    """Feed `text` in pieces of `size` characters: the content, the calls rebuilt from the
    deltas, and every delta."""
    parser, deltas = make(), []
    for start in range(0, len(text), size):
        deltas.append(parser.feed(text[start : start + size]))
    deltas.append(parser.finish())
    content = "".join(delta.content for delta in deltas)
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    for call in (call for delta in deltas for call in delta.calls):
        if call.name is not None:
            assert call.index not in names and call.arguments == ""  # the name comes first
            names[call.index], arguments[call.index] = call.name, ""
        else:
            arguments[call.index] += call.arguments
    return content, [ToolCall(names[i], arguments[i]) for i in sorted(names)], deltas


@pytest.mark.parametrize(("make", "text", "content", "calls"), OUTPUTS)
def test_a_finished_output_parses_into_content_and_calls(make, text, content, calls) -> None:
    parser = make()
    expected_content = (text if not calls else content) or None
    assert parser.parse(text) == (expected_content, calls)
    assert parser.complete
    for call in calls:
        assert isinstance(json.loads(call.arguments), dict)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 10_000])
@pytest.mark.parametrize(("make", "text", "content", "calls"), OUTPUTS)
def test_a_stream_in_any_pieces_sends_what_the_whole_output_parses_to(
    make, text, content, calls, size
) -> None:
    whole_content, whole_calls = make().parse(text)
    streamed_content, streamed_calls, _ = streamed(make, text, size)
    assert streamed_content == (whole_content or "")
    assert streamed_calls == whole_calls


def test_arguments_arrive_as_they_are_written() -> None:
    *_, deltas = streamed(HermesParser, HERMES, 4)
    pieces = [call for delta in deltas for call in delta.calls if call.index == 0]
    assert pieces[0].name == "get_weather"
    assert len(pieces) > 5  # not whole at the end


def test_text_that_may_open_a_call_is_held_back() -> None:
    parser = HermesParser()
    assert parser.feed("Hi <tool_").content == "Hi"
    assert parser.feed("ca").content == ""
    assert parser.feed("t!").content == " <tool_cat!"  # no call after all
    llama = Llama3JsonParser()
    assert llama.feed(" <|python").content == ""
    assert llama.feed('_tag|>{"na').calls == []
    (call,) = llama.feed('me": "f", "parameters": {"a"').calls[:1]
    assert call.name == "f"


@pytest.mark.parametrize(
    ("make", "text"),
    [
        (HermesParser, '<tool_call>{"name": "f", "arguments": {"city": "Ver'),
        (Llama3JsonParser, '{"name": "f", "parameters": {"a": 1]}'),
        (RequiredCalls, '[{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {'),
        (lambda: NamedArguments("f"), '{"city": "Ver'),
    ],
)
def test_a_call_begun_and_not_finished_leaves_the_output_incomplete(make, text) -> None:
    parser = make()
    parser.parse(text)
    assert not parser.complete
    stream = make()
    for char in text:
        stream.feed(char)
    stream.finish()
    assert not stream.complete and stream.calls == parser.calls
