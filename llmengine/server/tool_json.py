"""How far a tool call's JSON object has been written: its name, where its arguments lie.

A model writes a call as a JSON object, `{"name": "f", "arguments": {...}}` (Llama 3 says
"parameters"), one token at a time. `scan_call` reads such an object from the start, as much
of it as has arrived, and says what is known so far: the name once its string is closed,
where the arguments' value starts, where it ends once it has ended, and where the object
ends. A stream sends the name as soon as it is known and the arguments' text while it is
still being written, so the scan tells an unfinished object (wait for more text) from one
that is not a call (its text is content after all) without waiting for the end.

Values are delimited by brackets and quotes alone (`value_end`), then checked whole with
`json.loads`, so an object is never judged by a half-written value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum

ARGUMENT_KEYS = ("arguments", "parameters")  # Hermes and OpenAI say arguments, Llama 3 parameters
_CLOSERS = {"{": "}", "[": "]"}
_SCALAR_ENDS = frozenset(",}] \t\r\n")


class Shape(Enum):
    OPEN = "open"  # well formed so far, not finished
    DONE = "done"  # a whole object with a name and arguments
    NOT_A_CALL = "not a call"  # malformed, or a whole object that is no call


@dataclass(frozen=True, slots=True)
class CallScan:
    """What the text of one call object shows so far. Indices are into the scanned text;
    `arguments_end` is None while the arguments are being written, `end` while the object is."""

    shape: Shape
    name: str | None = None
    arguments_start: int | None = None
    arguments_end: int | None = None
    end: int | None = None


class ValueEnd:
    """Where the JSON string, object or array starting at `start` ends, judged by brackets
    and quotes only, read incrementally: each `advance` goes on from where the last stopped,
    so a stream reads a long value once, not once per token."""

    def __init__(self, start: int) -> None:
        self.pos = start
        self.depth = 0
        self.in_string = False
        self.escaped = False

    def advance(self, text: str) -> int | None:
        """The value's end in `text` (one past its last character); None while unfinished."""
        for i in range(self.pos, len(text)):
            char = text[i]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif char == "\\":
                    self.escaped = True
                elif char == '"':
                    self.in_string = False
                    if self.depth == 0:
                        return i + 1
            elif char == '"':
                self.in_string = True
            elif char in "{[":
                self.depth += 1
            elif char in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return i + 1
        self.pos = len(text)
        return None


def value_end(text: str, start: int) -> int | None:
    """Where the JSON value starting at `text[start]` ends, judged by brackets and quotes
    only; None while it is unfinished. A bare scalar ends at the delimiter after it."""
    if text[start] == '"' or text[start] in _CLOSERS:
        return ValueEnd(start).advance(text)
    for i in range(start, len(text)):
        if text[i] in _SCALAR_ENDS:
            return i
    return None


def skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def scan_call(text: str, start: int) -> CallScan:
    """Read the call object whose `{` is `text[start]`, as far as the text goes."""
    name, arguments_start, arguments_end = None, None, None

    def so_far(shape: Shape, end: int | None = None) -> CallScan:
        return CallScan(shape, name, arguments_start, arguments_end, end)

    if text[start] != "{":
        return so_far(Shape.NOT_A_CALL)
    i = start + 1
    while True:
        i = skip_space(text, i)
        if i == len(text):
            return so_far(Shape.OPEN)
        if text[i] == "}" and name is not None and arguments_end is not None:
            return so_far(Shape.DONE, i + 1)
        if text[i] != '"':
            return so_far(Shape.NOT_A_CALL)
        key_end = value_end(text, i)
        if key_end is None:
            return so_far(Shape.OPEN)
        try:
            key = json.loads(text[i:key_end])
        except json.JSONDecodeError:
            return so_far(Shape.NOT_A_CALL)
        i = skip_space(text, key_end)
        if i == len(text):
            return so_far(Shape.OPEN)
        if text[i] != ":":
            return so_far(Shape.NOT_A_CALL)
        i = skip_space(text, i + 1)
        if i == len(text):
            return so_far(Shape.OPEN)
        is_arguments = key in ARGUMENT_KEYS and arguments_start is None
        if is_arguments:
            if text[i] != "{":  # arguments are an object; anything else is no call
                return so_far(Shape.NOT_A_CALL)
            arguments_start = i
        end = value_end(text, i)
        if end is None:
            return so_far(Shape.OPEN)
        try:
            value = json.loads(text[i:end])
        except json.JSONDecodeError:
            return so_far(Shape.NOT_A_CALL)
        if key == "name":
            if not isinstance(value, str):
                return so_far(Shape.NOT_A_CALL)
            name = value
        if is_arguments:
            arguments_end = end
        i = skip_space(text, end)
        if i == len(text):
            return so_far(Shape.OPEN)
        if text[i] == ",":
            i += 1
        elif text[i] != "}":
            return so_far(Shape.NOT_A_CALL)
