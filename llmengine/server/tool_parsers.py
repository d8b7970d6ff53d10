"""Tool calls as models write them, one parser per way of writing them.

Each is a `ToolCallParser` (`llmengine.server.tool_reader`: incremental, holding back text
that may open a call) that says where its calls start. The formats (the names are vLLM's,
for `--tool-call-parser`):

- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, as many as the model
  writes; text outside the tags is content.
- `llama3_json`: Llama 3.x's JSON calls, `{"name": ..., "parameters": {...}}`, possibly after
  `<|python_tag|>`, several separated by `;`. Only an output that starts with a call holds
  calls; any other output is content.
- `RequiredCalls` and `NamedArguments` read the outputs that `tool_choice` "required" and a
  named function constrain (`llmengine.server.structured`): a JSON list of calls, and one
  function's arguments.
"""

from __future__ import annotations

import json

from llmengine.server.tool_json import skip_space
from llmengine.server.tool_reader import CallDelta, ParsedDelta, ToolCall, ToolCallParser


def held_prefix(text: str, marker: str) -> int:
    """Length of the longest tail of `text` that `marker` starts with."""
    for length in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-length:]):
            return length
    return 0


class HermesParser(ToolCallParser):
    """`<tool_call>{...}</tool_call>`, any number, content around them."""

    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def __init__(self) -> None:
        super().__init__()
        self._search_from = 0  # an opening before this was no call

    def _find_call(self, final: bool) -> tuple[int, int | None]:
        text = self.text
        if self.after_call:  # the closing tag, if the model wrote one
            start = skip_space(text, self.pos)
            rest = text[start:]
            if not final and (not rest or self.CLOSE.startswith(rest)):
                return self.pos, None
            self.after_call = False
            if rest.startswith(self.CLOSE):
                self.pos = start + len(self.CLOSE)
        opening = text.find(self.OPEN, max(self.pos, self._search_from))
        if opening < 0:
            return len(text) - (0 if final else held_prefix(text[self.pos :], self.OPEN)), None
        start = skip_space(text, opening + len(self.OPEN))
        if start == len(text):  # nothing after the tag yet (or ever: then it is content)
            return (len(text) if final else opening), None
        return opening, start

    def _not_a_call(self) -> None:
        # The tag and what follows are content; look for a call after this tag.
        self._search_from = self.text.find(self.OPEN, self.pos) + len(self.OPEN)


class Llama3JsonParser(ToolCallParser):
    """Llama 3.x: the output opens with a call (after `<|python_tag|>` perhaps); `;` between
    calls."""

    PYTHON_TAG = "<|python_tag|>"

    def _find_call(self, final: bool) -> tuple[int, int | None]:
        text = self.text
        start = skip_space(text, self.pos)
        if self.after_call:
            if start == len(text):
                return self.pos, None
            if text[start] != ";":
                self.prose = True  # text after the calls
                return self.pos, None
            start = skip_space(text, start + 1)
        elif text.startswith(self.PYTHON_TAG, start):
            start = skip_space(text, start + len(self.PYTHON_TAG))
        rest = text[start:]
        if not final and (not rest or (not self.calls and self.PYTHON_TAG.startswith(rest))):
            return self.pos, None  # not yet known whether a call comes
        if rest.startswith("{"):
            self.after_call = False
            return self.pos, start
        self.prose = True
        return self.pos, None


class RequiredCalls(ToolCallParser):
    """tool_choice "required": `[{"name": ..., "arguments": {...}}, ...]`, no content."""

    def _find_call(self, final: bool) -> tuple[int, int | None]:
        start = skip_space(self.text, self.pos)
        expected = ",]" if self.after_call else "["
        if start == len(self.text) or self.text[start] not in expected:
            self.prose = final or start < len(self.text)
            return self.pos, None
        if self.text[start] == "]":
            self.pos, self.prose = start + 1, True
            return self.pos, None
        call = skip_space(self.text, start + 1)
        if call == len(self.text):
            self.prose = final
            return self.pos, None
        return self.pos, call


class NamedArguments:
    """A named function's call: the whole output is its arguments."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.text = ""
        self.calls: list[ToolCall] = []
        self.content = ""
        self.complete = True

    def feed(self, text: str) -> ParsedDelta:
        out = ParsedDelta()
        if text and not self.text:
            out.calls.append(CallDelta(0, self.name))
        self.text += text
        if text:
            out.calls.append(CallDelta(0, arguments=text))
        return out

    def finish(self) -> ParsedDelta:
        try:
            self.complete = isinstance(json.loads(self.text), dict)
        except json.JSONDecodeError:
            self.complete = False
        if self.complete:
            self.calls.append(ToolCall(self.name, self.text))
        return ParsedDelta()

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        self.feed(text)
        self.finish()
        return None, self.calls


TOOL_CALL_PARSERS: dict[str, type[ToolCallParser]] = {
    "hermes": HermesParser,
    "llama3_json": Llama3JsonParser,
}
