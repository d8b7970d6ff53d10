"""The request bodies the server accepts, as pydantic models, and their sampling parameters.

The fields and defaults are OpenAI's (temperature 1.0, top_p 1.0, n 1; `max_tokens` 16 for
completions, its legacy default), plus vLLM's extensions: `top_k`, `min_p`,
`repetition_penalty`, `min_tokens`, `stop_token_ids`, `ignore_eos`, `skip_special_tokens`,
`include_stop_str_in_output`, `truncate_prompt_tokens` (the prompt's last k tokens),
`add_special_tokens`, `stream_options.continuous_usage_stats`, `request_id` (the response's
id is `cmpl-` or `chatcmpl-` and it) and, for chat, `add_generation_prompt`,
`continue_final_message`, `chat_template_kwargs` and `echo`. Types are strict (`"n": "2"` is
refused, not read as 2, while `63.0` is the integer 63) and ranges are checked here, so a
bad value is a 400 naming its field; `SamplingParams` checks again. `llmengine.server.fields`
lists the fields accepted and not used (bookkeeping such as `user` and `metadata`) and those
refused by name because ignoring them would change the answer (`best_of`, `suffix`, ...);
any other field is refused with a 400 naming it, so a client never takes prose for what it
asked. `response_format`, vLLM's `structured_outputs` and (chat) `tools` with `tool_choice`
constrain the output (`llmengine.server.structured`).

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

from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
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
from llmengine.server.chat import RESERVED_TEMPLATE_ARGS
from llmengine.server.fields import (
    REFUSED,
    Integer,
    LogitBias,
    Stop,
    logit_bias_pairs,
    refused,
)
from llmengine.server.messages import ChatMessage
from llmengine.server.structured import (
    STRICT,
    NamedToolChoice,
    ResponseFormat,
    StructuredOutputs,
    ToolChoice,
    Tools,
    named_tool,
    response_format_constraint,
    tool_call_constraint,
)
from llmengine.server.text_stream import TextOptions
from llmengine.structured.constraint import Constraint

DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's legacy default; null in a request means this too
MAX_N = 64
MAX_CHOICES = 256  # prompts x n in one request

TokenId = Annotated[Integer, Field(ge=0)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
Text = Annotated[StrictStr, Field(min_length=1)]


class StreamOptions(BaseModel):
    """What a stream reports besides text: the usage at its end (`include_usage`), and then
    also in every chunk, that choice's so far (`continuous_usage_stats`, vLLM's).
    `include_obfuscation` is accepted either way; no chunk ever carries an obfuscation field."""

    model_config = STRICT

    include_usage: bool = False
    continuous_usage_stats: bool = False
    include_obfuscation: bool | None = None


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
    temperature: Temperature | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[Integer, Field(ge=-1)] | None = None  # -1 and 0 both keep every token
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    seed: Annotated[Integer, Field(ge=0, lt=2**64)] | None = None
    stop: Stop | None = None
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: bool = False
    n: Annotated[Integer, Field(ge=1, le=MAX_N)] = 1
    min_tokens: Annotated[Integer, Field(ge=0)] = 0
    logit_bias: LogitBias | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    repetition_penalty: (
        Annotated[float, Field(ge=REPETITION_PENALTY_RANGE[0], le=REPETITION_PENALTY_RANGE[1])]
        | None
    ) = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    truncate_prompt_tokens: Annotated[Integer, Field(ge=1)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None  # vLLM's
    request_id: Annotated[StrictStr, Field(min_length=1, max_length=256)] | None = None
    # Accepted and not used (`llmengine.server.fields.UNUSED`).
    user: str | None = None
    store: bool | None = None
    metadata: dict[StrictStr, Any] | None = None
    service_tier: str | None = None
    priority: Integer | None = None
    # Refused unless they ask for nothing (`llmengine.server.fields.REFUSED`).
    use_beam_search: refused("use_beam_search", False) = None
    length_penalty: refused("length_penalty", 1.0) = None

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

    @property
    def continuous_usage(self) -> bool:
        """Whether every chunk carries its choice's usage so far (with include_usage, as in
        vLLM)."""
        options = self.stream_options
        return self.include_usage and options is not None and options.continuous_usage_stats

    @property
    def text_options(self) -> TextOptions:
        """How the choices' tokens become their text."""
        return TextOptions(
            self.stop_strings,
            include_stop=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens,
            min_tokens=self.min_tokens,
        )

    def sampling_params(
        self,
        max_tokens: int,
        sample: int,
        logprobs: int | None,
        prompt_logprobs: int | None,
        constraint: Constraint | None = None,
    ) -> SamplingParams:
        """The engine parameters of sample `sample` (0 to n-1) of one prompt.

        Only the penalties, `min_p`, `min_tokens`, `logit_bias` and logprobs a request sets
        are passed on, so the defaults are `SamplingParams`' own.
        """
        options: dict[str, Any] = {}
        for name in ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_p"):
            value = getattr(self, name)
            if value is not None:
                options[name] = value
        if self.min_tokens:
            options["min_tokens"] = self.min_tokens
        if self.logit_bias:
            options["logit_bias"] = logit_bias_pairs(self.logit_bias)
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
    max_tokens: Annotated[Integer, Field(ge=0)] | None = DEFAULT_COMPLETION_TOKENS
    logprobs: Annotated[Integer, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    prompt_logprobs: Annotated[Integer, Field(ge=0, le=MAX_LOGPROBS)] | None = None  # vLLM's
    add_special_tokens: bool = True  # the tokenizer's BOS before each text prompt
    best_of: Integer | None = None  # refused unless it equals n
    suffix: refused("suffix", "") = None

    @field_validator("best_of")
    @classmethod
    def _best_of_is_n(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and value != info.data.get("n"):
            raise ValueError(REFUSED["best_of"])
        return value

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
