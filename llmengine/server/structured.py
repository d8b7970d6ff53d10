"""What a request asks its output to be: OpenAI's `response_format` and `tools`, and vLLM's
`structured_outputs`, each turned into one engine `Constraint`.

- `response_format`: `{"type": "text"}` (no constraint), `{"type": "json_object"}` (any
  JSON object) or `{"type": "json_schema", "json_schema": {"name", "schema", ...}}`.
- `structured_outputs` (vLLM's extension, on both endpoints): exactly one of `json` (a
  schema), `json_object`, `regex`, `choice` or `grammar` (Lark or GBNF).
- `tools` with `tool_choice` (chat): `"required"` constrains the output to a JSON list of
  calls, `[{"name": ..., "arguments": {...}}]` (one call at most when
  `parallel_tool_calls` is false), and a named function to that function's arguments; the
  response carries them as `message.tool_calls` (`llmengine.server.tool_calls`).
  `"auto"` (the default when tools are given) and `"none"` leave the output free: the tools
  reach the chat template, so a model trained for tools sees them, and under "auto" a
  server started with `--tool-call-parser` reads the calls the model writes in its own
  format (`llmengine.server.tool_calls`); otherwise the output is returned as text.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, model_validator

from llmengine.structured.constraint import Constraint

STRICT = ConfigDict(extra="forbid", strict=True)
Name = Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]  # OpenAI's rule
MAX_TOOLS = 128


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    name: Name
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextFormat(BaseModel):
    model_config = STRICT
    type: Literal["text"]


class JsonObjectFormat(BaseModel):
    model_config = STRICT
    type: Literal["json_object"]


class JsonSchemaResponseFormat(BaseModel):
    model_config = STRICT
    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


ResponseFormat = Annotated[
    TextFormat | JsonObjectFormat | JsonSchemaResponseFormat, Field(discriminator="type")
]


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs`: exactly one field set."""

    model_config = STRICT

    json_: dict[str, Any] | StrictStr | None = Field(default=None, alias="json")
    json_object: StrictBool | None = None
    regex: Annotated[StrictStr, Field(min_length=1)] | None = None
    choice: (
        Annotated[list[Annotated[StrictStr, Field(min_length=1)]], Field(min_length=1)] | None
    ) = None
    grammar: Annotated[StrictStr, Field(min_length=1)] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputs:
        chosen = [name for name in ("json_", "regex", "choice", "grammar") if getattr(self, name)]
        if self.json_object:
            chosen.append("json_object")
        if len(chosen) != 1:
            raise ValueError("set exactly one of json, json_object, regex, choice, grammar")
        return self

    def constraint(self) -> Constraint:
        if self.json_ is not None:
            return Constraint.json_schema(self.json_)
        if self.regex is not None:
            return Constraint.regex(self.regex)
        if self.choice is not None:
            return Constraint.choice(self.choice)
        if self.grammar is not None:
            return Constraint.grammar(self.grammar)
        return Constraint.json_object()


class FunctionDefinition(BaseModel):
    model_config = STRICT

    name: Name
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    model_config = STRICT

    type: Literal["function"]
    function: FunctionDefinition


class FunctionReference(BaseModel):
    model_config = STRICT
    name: Name


class NamedToolChoice(BaseModel):
    model_config = STRICT

    type: Literal["function"]
    function: FunctionReference


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice
Tools = Annotated[list[Tool], Field(min_length=1, max_length=MAX_TOOLS)]


def response_format_constraint(response_format: Any) -> Constraint | None:
    """The constraint of a `response_format`; None for text."""
    if isinstance(response_format, JsonObjectFormat):
        return Constraint.json_object()
    if isinstance(response_format, JsonSchemaResponseFormat):
        schema = response_format.json_schema.schema_
        return Constraint.json_object() if schema is None else Constraint.json_schema(schema)
    return None


def arguments_schema(tool: Tool) -> dict[str, Any]:
    """A function's arguments: its `parameters` schema, or any object when it has none."""
    return tool.function.parameters or {"type": "object"}


def tool_call_constraint(
    tools: list[Tool], tool_choice: Any, parallel_tool_calls: bool | None
) -> Constraint | None:
    """The constraint a `tool_choice` puts on the output: a named function's arguments, a
    list of calls for "required", none for "auto" and "none"."""
    if isinstance(tool_choice, NamedToolChoice):
        tool = named_tool(tools, tool_choice.function.name)
        return Constraint.json_schema(arguments_schema(tool))
    if tool_choice != "required":
        return None
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": tool.function.name},
                "arguments": arguments_schema(tool),
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    schema: dict[str, Any] = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
    if parallel_tool_calls is False:
        schema["maxItems"] = 1
    return Constraint.json_schema(schema)


def named_tool(tools: list[Tool], name: str) -> Tool:
    """The tool called `name`; ValueError when the request defines none by that name."""
    for tool in tools:
        if tool.function.name == name:
            return tool
    defined = ", ".join(tool.function.name for tool in tools)
    raise ValueError(f"names the function {name!r}, which tools does not define "
                     f"(it defines {defined})")  # fmt: skip
