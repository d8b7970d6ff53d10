"""The messages of a chat request: what each role may send, and how a template reads it.

OpenAI's shapes: text content as a string or as text parts, an assistant's `tool_calls`
(sent back in a conversation's history) and a tool's answer naming the call it answers.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, model_validator

from llmengine.server.structured import STRICT


class TextPart(BaseModel):
    model_config = STRICT

    type: Literal["text"]
    text: str


class CalledFunction(BaseModel):
    model_config = STRICT

    name: str
    arguments: str


class ToolCall(BaseModel):
    """A call an assistant message made, as the response gave it (sent back in a history)."""

    model_config = STRICT

    id: str
    type: Literal["function"]
    function: CalledFunction


class ChatMessage(BaseModel):
    model_config = STRICT

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's
    tool_call_id: str | None = None  # a tool's answer to that call

    @model_validator(mode="after")
    def _calls_from_the_assistant(self) -> ChatMessage:
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError(f"tool_calls belong to an assistant message, not a {self.role}'s")
        return self

    def template_fields(self) -> dict[str, Any]:
        """The message as a chat template reads it: role and text, and the tool fields set."""
        fields: dict[str, Any] = {"role": self.role, "content": self.text}
        if self.tool_calls:
            fields["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        for name in ("name", "tool_call_id"):
            if getattr(self, name) is not None:
                fields[name] = getattr(self, name)
        return fields

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)
