"""Tool calls in a chat choice's output, shaped as OpenAI's `tool_calls`, whole or streamed.

Which output holds calls, and how they are read (`llmengine.server.tool_parsers`):

- tool_choice a named function: the constrained output is that function's arguments;
- tool_choice "required": the constrained output is a list of `{"name", "arguments"}`;
- tool_choice "auto" (or tools with no tool_choice), when the server has a
  `--tool-call-parser`: the free output, read in the model's own format (`hermes`,
  `llama3_json`); an output with no call in it is plain content. Its text keeps special
  tokens (`reads_model_syntax`), since a tag may be one. Without a parser, and under
  "none", the output is content as it is.

A finished choice whose calls were all written whole has `message.tool_calls` (each call's
`arguments` the JSON text the model wrote), the text outside them as `content` (null when
there is none) and finish_reason "tool_calls" when the model stopped on its own (a budget
run out keeps "length"). A call begun and not finished (cut short by max_tokens, or written
wrong) leaves the whole output as text, with the engine's finish reason; a stream has sent
that call's pieces by then, and the same finish reason says they are unfinished.

A stream sends a call as OpenAI does: first `{"index", "id", "type": "function",
"function": {"name", "arguments": ""}}` once its name is known, then `{"index", "function":
{"arguments": piece}}` as its arguments are written; the pieces join into the arguments a
non-streamed response returns. Text that may yet start a call is held back.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, Protocol

from llmengine.server.structured import NamedToolChoice
from llmengine.server.tool_parsers import TOOL_CALL_PARSERS, NamedArguments, RequiredCalls
from llmengine.server.tool_reader import ParsedDelta, ToolCall


class CallReader(Protocol):
    """What every tool-call parser offers (`llmengine.server.tool_reader`)."""

    calls: list[ToolCall]
    content: str
    complete: bool

    def feed(self, text: str) -> ParsedDelta: ...
    def finish(self) -> ParsedDelta: ...
    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]: ...


def call_reader(
    tools: list[Any] | None, tool_choice: Any, parser_name: str | None
) -> Callable[[], CallReader] | None:
    """What makes a choice's call reader for this request; None when its output is text."""
    if tools is None:
        return None
    if isinstance(tool_choice, NamedToolChoice):
        name = tool_choice.function.name
        return lambda: NamedArguments(name)
    if tool_choice == "required":
        return RequiredCalls
    if reads_model_syntax(tools, tool_choice, parser_name):
        return TOOL_CALL_PARSERS[parser_name]  # type: ignore[index]  # not None: checked
    return None


def reads_model_syntax(tools: list[Any] | None, tool_choice: Any, parser_name: str | None) -> bool:
    """Whether a choice's calls are read from the model's own syntax (tools, tool_choice
    "auto" or none given, and a parser). Such a choice is decoded with its special tokens
    kept, as vLLM's Hermes parser asks: a checkpoint may mark its tags (`<tool_call>`,
    `<|python_tag|>`) special, and a tag left out of the text is a call the parser misses."""
    return tools is not None and tool_choice in (None, "auto") and parser_name is not None


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def finish_reason_of(reader: CallReader, engine_reason: str) -> str:
    """ "tool_calls" for calls written whole by a model that stopped on its own."""
    if reader.complete and reader.calls and engine_reason == "stop":
        return "tool_calls"
    return engine_reason


def message_of(text: str, finish_reason: str, reader: CallReader) -> tuple[dict, str]:
    """A finished choice's message and finish reason."""
    content, calls = reader.parse(text)
    if not reader.complete or not calls:
        return {"role": "assistant", "content": text}, finish_reason
    shaped = [
        {"id": _call_id(), "type": "function",
         "function": {"name": call.name, "arguments": call.arguments}}
        for call in calls
    ]  # fmt: skip
    message = {"role": "assistant", "content": content, "tool_calls": shaped}
    return message, finish_reason_of(reader, finish_reason)


def stream_deltas(reader: CallReader, text: str, *, last: bool) -> list[dict[str, Any]]:
    """The stream deltas a choice's new `text` makes (none while it is held back): content,
    each call's first delta, its arguments' pieces. `last` flushes what was held."""
    parsed = reader.feed(text)
    if last:
        rest = reader.finish()
        parsed.content += rest.content
        parsed.calls.extend(rest.calls)
    deltas: list[dict[str, Any]] = [{"content": parsed.content}] if parsed.content else []
    for call in parsed.calls:
        if call.name is not None:
            function = {"name": call.name, "arguments": ""}
            first = {"index": call.index, "id": _call_id(), "type": "function"}
            deltas.append({"tool_calls": [{**first, "function": function}]})
        if call.arguments:
            piece = {"index": call.index, "function": {"arguments": call.arguments}}
            deltas.append({"tool_calls": [piece]})
    return deltas
