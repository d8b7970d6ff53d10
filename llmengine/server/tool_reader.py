"""Reading a model's text for tool calls as it is written: what every format shares.

A parser (`ToolCallParser`; the formats are in `llmengine.server.tool_parsers`) reads one
choice's output incrementally: `feed` takes the next piece of text and returns a
`ParsedDelta` (content now safe to send, and for each call its name once known, then pieces
of its arguments' JSON text as they are written); `finish` flushes what was held back. Text
that might still turn out to be the start of a call is held back, never sent as content. A
finished output is parsed by the same code fed all at once (`parse`), so a stream's pieces
always join into exactly what a non-streamed response returns.

A call's `arguments` is the JSON text of its arguments exactly as the model wrote it. The
content is the text outside the calls, less the whitespace that only surrounds them (text
before and after a call joins with the whitespace that preceded the call); an output with
no call keeps all its text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmengine.server.tool_json import Shape, ValueEnd, scan_call


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
        self._arguments: ValueEnd | None = None  # its arguments' end, while they are written
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
        index = len(self.calls)
        if self._arguments is not None:  # still being written: send them, nothing to scan
            end = self._arguments.advance(self.text)
            self._send_arguments(out, index, len(self.text) if end is None else end)
            if end is None and not final:
                return False
            self._arguments = None
        scan = scan_call(self.text, self.call_start)
        unfinished = scan.shape is Shape.OPEN and final
        # A call starts once its name and the start of its arguments are known, whatever
        # follows (so that a stream and a whole output decide alike).
        starts = scan.name is not None and scan.arguments_start is not None
        if not self._started and not starts and (scan.shape is Shape.NOT_A_CALL or unfinished):
            self.call_start = None
            self._not_a_call()
            return True
        if not self._started and starts:
            assert scan.arguments_start is not None
            self._started = True
            if not self.content:  # whitespace before the first call is no content
                self._space = ""
            self._arguments_sent = scan.arguments_start
            out.calls.append(CallDelta(index, scan.name))
            if scan.arguments_end is None:
                self._arguments = ValueEnd(scan.arguments_start)
                self._arguments.advance(self.text)
        if self._started:
            end = scan.arguments_end if scan.arguments_end is not None else len(self.text)
            self._send_arguments(out, index, end)
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

    def _send_arguments(self, out: ParsedDelta, index: int, end: int) -> None:
        if end > self._arguments_sent:
            piece = self.text[self._arguments_sent : end]
            out.calls.append(CallDelta(index, arguments=piece))
            self._arguments_sent = end

    def _send_content(self, out: ParsedDelta, text: str, *, last: bool = False) -> None:
        if self._strip_next:  # content right after a call starts at its first non-space
            text = text.lstrip()
            if not text:
                return
            self._strip_next = False
        text = self._space + text
        body = text if last else text.rstrip()  # trailing whitespace waits for what follows
        self._space = text[len(body) :]
        out.content += body
        self.content += body
