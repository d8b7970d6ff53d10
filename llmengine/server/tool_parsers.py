"""Tool calls found in a model's text as it is written, one parser per way of writing them.

Each parser reads one choice's output incrementally: `feed` takes the next piece of text and
returns a `ParsedDelta` (content now safe to send, and for each call its name once known,
then pieces of its arguments' JSON text as they are written); `finish` flushes what was held
back. Text that might still turn out to be the start of a call is held back, never sent as
content. A finished output is parsed by the same code fed all at once (`parse`), so a
stream's pieces always join into exactly what a non-streamed response returns.

The formats (the names are vLLM's, for `--tool-call-parser`):

- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, as many as the model
  writes; text outside the tags is content.
- `llama3_json`: Llama 3.x's JSON calls, `{"name": ..., "parameters": {...}}`, possibly after
  `<|python_tag|>`, several separated by `;`. Only an output that starts with a call holds
  calls; any other output is content.
- `RequiredCalls` and `NamedArguments` read the outputs that `tool_choice` "required" and a
  named function constrain (`llmengine.server.structured`): a JSON list of calls, and one
  function's arguments.

A call's `arguments` is the JSON text of its arguments exactly as the model wrote it. The
content is the text outside the calls, less the whitespace that only surrounds them (text
before and after a call joins with the whitespace that preceded the call); an output with
no call keeps all its text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from llmengine.server.tool_json import Shape, scan_call, skip_space


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: str  # JSON text of an object


@dataclass(frozen=True, slots=True)
class CallDelta:
    """Call `index`'s news: its name (only in its first delta), or a piece of its arguments."""

    index: int
    name: str | None = None
    arguments: str = ""


@dataclass(slots=True)
class ParsedDelta:
    content: str = ""
    calls: list[CallDelta] = field(default_factory=list)


class ToolCallParser:
    """The reading every format shares; a format says where calls start (`_find_call`).

    After `finish`: `calls` (the calls written whole), `content` (every piece of content
    sent) and `complete` (False when a call was begun and never finished).
    """

    def __init__(self) -> None:
        self.text = ""
        self.pos = 0  # text before pos is spent: sent as content, or part of a call
        self.call_start: int | None = None  # the `{` of the call being read
        self.after_call = False  # a call ended at pos: its format's closing may follow
        self.prose = False  # no call can follow: the rest is content
        self.calls: list[ToolCall] = []
        self.content = ""
        self.complete = True
        self._started = False  # the call being read has had its name sent
        self._arguments_sent = 0  # where its arguments' text sent so far ends
        self._space = ""  # whitespace held back: content only if more content follows
        self._strip_next = False  # a call just ended: whitespace after it is no content

    def feed(self, text: str) -> ParsedDelta:
        self.text += text
        return self._advance(final=False)

    def finish(self) -> ParsedDelta:
        out = self._advance(final=True)
        if not self.calls and self._space:  # an output with no call keeps all its text
            self._send_content(out, "", last=True)
        return out

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """A finished output's content (None when empty) and calls."""
        self.feed(text)
        self.finish()
        return self.content or None, self.calls

    def _find_call(self, final: bool) -> tuple[int, int | None]:
        """From `pos`: where the content that is safe to send ends, and where the next call's
        `{` is (None if none yet). Text between the two is the format's opening (dropped)."""
        raise NotImplementedError

    def _not_a_call(self) -> None:
        """What follows an opening whose object turned out to be no call (the default: the
        rest of the output is content)."""
        self.prose = True

    def _advance(self, final: bool) -> ParsedDelta:
        out = ParsedDelta()
        while True:
            if self.call_start is None:
                if self.prose:
                    self._send_content(out, self.text[self.pos :])
                    self.pos = len(self.text)
                    return out
                content_end, self.call_start = self._find_call(final)
                self._send_content(out, self.text[self.pos : content_end])
                self.pos = content_end
                if self.call_start is None and not self.prose:
                    return out  # wait for more text
            elif not self._read_call(out, final):
                return out

    def _read_call(self, out: ParsedDelta, final: bool) -> bool:
        """Send what is new of the call being read; whether reading can go on."""
        assert self.call_start is not None
        scan = scan_call(self.text, self.call_start)
        unfinished = scan.shape is Shape.OPEN and final
        # A call starts once its name and the start of its arguments are known, whatever
        # follows (so that a stream and a whole output decide alike).
        starts = scan.name is not None and scan.arguments_start is not None
        if not self._started and not starts and (scan.shape is Shape.NOT_A_CALL or unfinished):
            self.call_start = None
            self._not_a_call()
            return True
        index = len(self.calls)
        if not self._started and starts:
            self._started = True
            if not self.content:  # whitespace before the first call is no content
                self._space = ""
            self._arguments_sent = scan.arguments_start
            out.calls.append(CallDelta(index, scan.name))
        if self._started:
            end = scan.arguments_end if scan.arguments_end is not None else len(self.text)
            if end > self._arguments_sent:
                piece = self.text[self._arguments_sent : end]
                out.calls.append(CallDelta(index, arguments=piece))
                self._arguments_sent = end
        if scan.shape is Shape.DONE:
            assert scan.name is not None and scan.arguments_start is not None and scan.end
            arguments = self.text[scan.arguments_start : self._arguments_sent]
            self.calls.append(ToolCall(scan.name, arguments))
            self.pos, self.call_start, self._started = scan.end, None, False
            self.after_call = self._strip_next = True
            return True
        if self._started and (scan.shape is Shape.NOT_A_CALL or unfinished):
            # A call begun and broken: what its arguments did not take is content.
            self.complete = False
            self.pos, self.call_start, self._started = self._arguments_sent, None, False
            self.prose = True
            return True
        return False

    def _send_content(self, out: ParsedDelta, text: str, *, last: bool = False) -> None:
        if self._strip_next:  # content right after a call starts at its first non-space
            text = text.lstrip()
            if not text:
                return
            self._strip_next = False
        text = self._space + text
        body = text if last else text.rstrip()
        self._space = text[len(body) :]
        if body.strip() or last:
            out.content += body
            self.content += body
        else:
            self._space = text  # whitespace alone waits for what follows it


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
