"""What a request's output must match: plain data, compiled only when a request uses it.

A `Constraint` is one of five kinds, each with its own constructor: a JSON schema, any JSON
object, a regular expression, a choice among strings, or a grammar (Lark or llama.cpp's
GBNF). It holds the source as text, so two requests asking for the same thing hold equal
constraints and share one compiled grammar (`llmengine.structured.grammar`). Checks here
are about the shape of the input (valid JSON, a non-empty choice); whether the grammar
compiles is the compiler's question, and its answer names the problem.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

ConstraintKind = Literal["json_schema", "json_object", "regex", "choice", "grammar"]
KINDS: tuple[str, ...] = ("json_schema", "json_object", "regex", "choice", "grammar")
MAX_SOURCE_CHARS = 100_000  # a grammar larger than this is refused before it is compiled


@dataclass(frozen=True, slots=True)
class Constraint:
    """One output language: `kind` names it and `source` spells it (JSON text for a schema
    or a choice; the pattern or grammar itself otherwise; empty for any JSON object)."""

    kind: ConstraintKind
    source: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"a constraint's kind is one of {KINDS}, got {self.kind!r}")
        if not isinstance(self.source, str):
            raise ValueError(f"a constraint's source is text, got {type(self.source).__name__}")
        if len(self.source) > MAX_SOURCE_CHARS:
            raise ValueError(
                f"the {self.kind} is {len(self.source)} characters; at most "
                f"{MAX_SOURCE_CHARS} are accepted"
            )
        if self.kind in ("regex", "grammar") and not self.source:
            raise ValueError(f"an empty {self.kind} matches nothing useful")
        if self.kind == "json_schema":
            schema = _parse(self.source, "the JSON schema")
            if not isinstance(schema, dict | bool):
                raise ValueError("a JSON schema is an object (or true/false)")
        if self.kind == "choice":
            options = _parse(self.source, "the choice")
            if not isinstance(options, list) or not options:
                raise ValueError("a choice is a non-empty list of strings")
            if not all(isinstance(option, str) and option for option in options):
                raise ValueError("every option of a choice is a non-empty string")

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | bool | str) -> Constraint:
        """Output that a JSON schema validates (the schema as a dict, or as JSON text)."""
        source = schema if isinstance(schema, str) else json.dumps(schema)
        return cls("json_schema", source)

    @classmethod
    def json_object(cls) -> Constraint:
        """Any JSON object (OpenAI's `response_format: {"type": "json_object"}`)."""
        return cls("json_object")

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        """Output that the whole regular expression matches (Rust `regex` syntax)."""
        return cls("regex", pattern)

    @classmethod
    def choice(cls, options: Sequence[str]) -> Constraint:
        """Exactly one of `options`, verbatim."""
        if isinstance(options, str):
            raise ValueError("a choice is a list of strings, not one string")
        return cls("choice", json.dumps(list(options)))

    @classmethod
    def grammar(cls, text: str) -> Constraint:
        """Output of a context-free grammar, in Lark or llama.cpp's GBNF syntax."""
        return cls("grammar", text)


def _parse(source: str, what: str) -> Any:
    try:
        return json.loads(source)
    except json.JSONDecodeError as error:
        raise ValueError(f"{what} is not valid JSON: {error}") from None
