"""The request bodies the server accepts, as pydantic models, and their sampling parameters.

The fields and defaults are OpenAI's (temperature 1.0, top_p 1.0, n 1; `max_tokens` 16 for
completions, its legacy default), plus vLLM's extensions `top_k`, `repetition_penalty`,
`stop_token_ids` and `ignore_eos`. Types are strict (`"n": "2"` is refused, not read as 2)
and ranges are checked here, so a bad value is a 400 naming its field; `SamplingParams`
checks again. A field this server does not implement (`logit_bias`, `best_of`, `suffix`,
...) is refused with a 400 naming it rather than ignored, so a client never takes prose for
what it asked. `response_format`, vLLM's `structured_outputs` and (chat) `tools` with
`tool_choice` constrain the output (`llmengine.server.structured`). `user` is accepted and
not used (OpenAI keeps it for abuse monitoring).

One request is at most `MAX_CHOICES` engine requests (prompts x n): everything it costs
before the engine sees it is bounded by that.

`echo` (completions) starts each choice's text with its prompt, and with `logprobs` scores
the prompt too (its first token `null`, as OpenAI does); `max_tokens: 0` then asks for the
prompt's scores alone, which is how lm-eval's loglikelihood tasks call. vLLM's
`prompt_logprobs` adds each choice's prompt scores in vLLM's format (without its `rank`).

`n` samples of one prompt are independent requests to the engine; with a `seed`, sample i
uses seed + i, so they differ from each other yet the whole response is reproducible.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from llmengine.params import (
    MAX_LOGPROBS,
    MAX_TEMPERATURE,
    MIN_TEMPERATURE,
    REPETITION_PENALTY_RANGE,
    SamplingParams,
)
from llmengine.server.structured import (
    NamedToolChoice,
    ResponseFormat,
    StructuredOutputs,
    ToolChoice,
    Tools,
    named_tool,
    response_format_constraint,
    tool_call_constraint,
)
from llmengine.structured.constraint import Constraint

DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's legacy default; null in a request means this too
MAX_N = 64
MAX_CHOICES = 256  # prompts x n in one request
STRICT = ConfigDict(extra="forbid", strict=True)

TokenIds = Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(min_length=1)]
Text = Annotated[StrictStr, Field(min_length=1)]


class StreamOptions(BaseModel):
    model_config = STRICT

    include_usage: bool = False


def _temperature_in_range(value: float) -> float:
    if value != 0 and value < MIN_TEMPERATURE:
        raise ValueError(f"must be 0 (greedy) or at least {MIN_TEMPERATURE}")
    if value > MAX_TEMPERATURE:
        raise ValueError(f"must be at most {MAX_TEMPERATURE:.4g} (float32's largest number)")
    return value


def _has_lone_surrogate(value: Any) -> bool:
    """Whether any string in `value` (nested in lists and dicts) cannot be encoded as UTF-8."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
    return False


Temperature = Annotated[float, Field(ge=0.0), AfterValidator(_temperature_in_range)]


class SamplingFields(BaseModel):
    """What both endpoints take, in the same spelling."""

    model_config = STRICT

    model: str | None = None
    user: str | None = None  # accepted, not used
    temperature: Temperature | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None  # -1 and 0 both keep every token
    seed: Annotated[int, Field(ge=0, lt=2**64)] | None = None
    stop: Text | Annotated[list[Text], Field(max_length=16)] | None = None
    stop_token_ids: list[Annotated[StrictInt, Field(ge=0)]] | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    repetition_penalty: (
        Annotated[float, Field(ge=REPETITION_PENALTY_RANGE[0], le=REPETITION_PENALTY_RANGE[1])]
        | None
    ) = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None  # vLLM's

    @model_validator(mode="before")
    @classmethod
    def _no_lone_surrogates(cls, data: Any) -> Any:
        """Refuse text that is not Unicode: JSON may escape half a UTF-16 pair (`"\\udfff"`),
        which no tokenizer can encode and no response can echo back."""
        if isinstance(data, dict):
            for name, value in data.items():
                if _has_lone_surrogate(name):
                    raise ValueError("a field's name holds a lone UTF-16 surrogate, not text")
                if _has_lone_surrogate(value):
                    raise ValueError(f"{name} holds a lone UTF-16 surrogate, which is not text")
        return data

    @field_validator("structured_outputs")
    @classmethod
    def _one_constraint(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and info.data.get("response_format") is not None:
            raise ValueError("response_format and structured_outputs both constrain the "
                             "output; send one")  # fmt: skip
        return value

    def constraint(self) -> Constraint | None:
        """What the output must match, or None when it is free."""
        if self.structured_outputs is not None:
            return self.structured_outputs.constraint()
        return response_format_constraint(self.response_format)

    @property
    def constraint_field(self) -> str:
        """The field a refused constraint is blamed on."""
        return "structured_outputs" if self.structured_outputs is not None else "response_format"

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream and self.stream_options is not None and self.stream_options.include_usage

    def sampling_params(
        self,
        max_tokens: int,
        sample: int,
        logprobs: int | None,
        prompt_logprobs: int | None,
        constraint: Constraint | None = None,
    ) -> SamplingParams:
        """The engine parameters of sample `sample` (0 to n-1) of one prompt.

        Only the penalties and logprobs a request sets are passed on, so the defaults are
        `SamplingParams`' own.
        """
        options: dict[str, Any] = {}
        for name in ("presence_penalty", "frequency_penalty", "repetition_penalty"):
            value = getattr(self, name)
            if value is not None:
                options[name] = value
        if logprobs is not None:
            options["logprobs"] = logprobs
        if prompt_logprobs is not None:
            options["prompt_logprobs"] = prompt_logprobs
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=max(self.top_k or 0, 0),
            seed=None if self.seed is None else (self.seed + sample) % 2**64,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
            constraint=constraint,
            **options,
        )


class CompletionRequest(SamplingFields):
    """POST /v1/completions: a prompt as text or token ids, or a list of either."""

    prompt: (
        Text
        | TokenIds
        | Annotated[list[Text], Field(min_length=1)]
        | Annotated[list[TokenIds], Field(min_length=1)]
    )
    echo: bool = False  # before max_tokens, whose check reads it
    max_tokens: Annotated[int, Field(ge=0)] | None = DEFAULT_COMPLETION_TOKENS
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    prompt_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None  # vLLM's

    @field_validator("max_tokens")
    @classmethod
    def _zero_tokens_only_with_echo(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value == 0 and not info.data.get("echo"):
            raise ValueError("0 asks for no text at all; it needs echo: true")
        return value

    @property
    def budget(self) -> int:
        """The tokens asked for: `max_tokens`, 16 when null (OpenAI's legacy default)."""
        return DEFAULT_COMPLETION_TOKENS if self.max_tokens is None else self.max_tokens

    @property
    def prompt_scores(self) -> int | None:
        """The k of the prompt's own logprobs the engine computes: `prompt_logprobs`, or
        `logprobs` when the prompt is echoed with logprobs (as OpenAI scores it then)."""
        if self.prompt_logprobs is not None:
            return self.prompt_logprobs
        return self.logprobs if self.echo else None

    @model_validator(mode="after")
    def _bounded(self) -> CompletionRequest:
        count = len(self.prompts())
        if count * self.n > MAX_CHOICES:
            raise ValueError(
                f"{count} prompts x n={self.n} is {count * self.n} choices; "
                f"one request may ask for at most {MAX_CHOICES}"
            )
        return self

    def prompts(self) -> list[str | list[int]]:
        """Each prompt of the request on its own: a text, or a list of token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if isinstance(prompt[0], int):
            return [list(prompt)]  # type: ignore[arg-type]
        return list(prompt)  # type: ignore[arg-type]


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


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions: messages, rendered through the chat template."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    tools: Tools | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None

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
