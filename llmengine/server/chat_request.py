"""POST /v1/chat/completions' body: messages, rendered through the chat template.

Besides the shared fields (`llmengine.server.sampling_fields`) it takes the chat's own:
`max_completion_tokens` (or the older `max_tokens`; none asks for all that fit), `logprobs`
with `top_logprobs`, `tools` with `tool_choice` (a required or named call constrains the
output to the call's JSON, `llmengine.server.structured`), and vLLM's `add_generation_prompt`,
`continue_final_message`, `chat_template_kwargs` and `echo`, which say how the messages become
the prompt (`llmengine.server.chat`). Each check that crosses fields (a forced call with a
response format, `top_logprobs` without `logprobs`) is a 400 naming the field.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, StrictStr, ValidationInfo, field_validator

from llmengine.params import MAX_LOGPROBS
from llmengine.server.chat import RESERVED_TEMPLATE_ARGS
from llmengine.server.fields import Integer, refused
from llmengine.server.messages import ChatMessage
from llmengine.server.sampling_fields import SamplingFields
from llmengine.server.structured import (
    NamedToolChoice,
    ToolChoice,
    Tools,
    named_tool,
    tool_call_constraint,
)
from llmengine.structured.constraint import Constraint


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions: messages, rendered through the chat template."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[Integer, Field(ge=1)] | None = None
    max_tokens: Annotated[Integer, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[Integer, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    tools: Tools | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # How the messages become the prompt (vLLM's): see `llmengine.server.chat`.
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[StrictStr, Any] | None = None
    add_special_tokens: bool = False  # the template writes the special tokens it needs
    echo: bool = False  # the reply starts with the last message when that is an assistant's
    # Accepted and not used (`llmengine.server.fields.UNUSED`).
    reasoning_effort: str | None = None
    prediction: dict[StrictStr, Any] | None = None
    # Refused unless they ask for nothing (`llmengine.server.fields.REFUSED`).
    functions: refused("functions", []) = None
    function_call: refused("function_call") = None
    audio: refused("audio") = None
    modalities: refused("modalities", ["text"]) = None

    @field_validator("echo")
    @classmethod
    def _no_echo_before_a_forced_call(cls, value: bool, info: ValidationInfo) -> bool:
        choice = info.data.get("tool_choice")
        if value and (choice == "required" or isinstance(choice, NamedToolChoice)):
            raise ValueError("a required tool call is JSON alone; it cannot start with the "
                             "last message")  # fmt: skip
        return value

    @field_validator("chat_template_kwargs")
    @classmethod
    def _no_reserved_template_args(cls, value: dict | None) -> dict | None:
        for name in sorted(RESERVED_TEMPLATE_ARGS & set(value or ())):
            raise ValueError(f"{name} is the server's to set (from the request's own fields)")
        return value

    @field_validator("continue_final_message")
    @classmethod
    def _continue_or_prompt(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("add_generation_prompt"):
            raise ValueError("needs add_generation_prompt: false (the last message goes on, "
                             "so no new one starts)")  # fmt: skip
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_with_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value and not info.data.get("logprobs"):
            raise ValueError("needs logprobs: true")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _a_choice_among_the_tools(cls, value: Any, info: ValidationInfo) -> Any:
        tools = info.data.get("tools")
        if value is None:
            return value
        if tools is None:
            raise ValueError("needs tools to choose from")
        if isinstance(value, NamedToolChoice):
            named_tool(tools, value.function.name)
        forced = value == "required" or isinstance(value, NamedToolChoice)
        if forced and (info.data.get("response_format") or info.data.get("structured_outputs")):
            raise ValueError("a required tool call and a response format both constrain the "
                             "output; send one")  # fmt: skip
        return value

    @property
    def calls_tools(self) -> bool:
        """Whether the output is a tool call: tool_choice "required" or a named function."""
        return self.tools is not None and (
            self.tool_choice == "required" or isinstance(self.tool_choice, NamedToolChoice)
        )

    def constraint(self) -> Constraint | None:
        if self.calls_tools:
            assert self.tools is not None
            return tool_call_constraint(self.tools, self.tool_choice, self.parallel_tool_calls)
        return super().constraint()

    @property
    def constraint_field(self) -> str:
        return "tools" if self.calls_tools else super().constraint_field

    @property
    def requested_max_tokens(self) -> int | None:
        """`max_completion_tokens`, or the older `max_tokens`; None asks for all that fit."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        """The k of top-k log-probabilities per token, or None when not asked for."""
        if not self.logprobs:
            return None
        return self.top_logprobs or 0
