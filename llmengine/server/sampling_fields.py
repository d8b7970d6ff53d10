"""The fields both endpoints take (`SamplingFields`), and the sampling parameters they make.

The fields and defaults are OpenAI's (temperature 1.0, top_p 1.0, n 1), plus vLLM's
extensions: `top_k`, `min_p`, `repetition_penalty`, `min_tokens`, `stop_token_ids`,
`ignore_eos`, `skip_special_tokens`, `include_stop_str_in_output`, `truncate_prompt_tokens`
(the prompt's last k tokens), `stream_options.continuous_usage_stats` and `request_id` (the
response's id is `cmpl-` or `chatcmpl-` and it). Types are strict (`"n": "2"` is refused,
not read as 2, while `63.0` is the integer 63) and ranges are checked here, so a bad value is
a 400 naming its field; `SamplingParams` checks again. `llmengine.server.fields` lists the
fields accepted and not used (bookkeeping such as `user` and `metadata`) and those refused by
name because ignoring them would change the answer (`best_of`, `suffix`, ...); any other
field is refused with a 400 naming it, so a client never takes prose for what it asked.
`response_format` and vLLM's `structured_outputs` constrain the output
(`llmengine.server.structured`).

These fields live apart from the two request bodies (`llmengine.server.protocol`'s
`CompletionRequest`, `llmengine.server.chat_request`'s `ChatCompletionRequest`) because both
inherit them unchanged: one place says what a sampling field means and how it is checked.

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
    MAX_TEMPERATURE,
    MIN_TEMPERATURE,
    REPETITION_PENALTY_RANGE,
    SamplingParams,
)
from llmengine.server.fields import (
    Integer,
    LogitBias,
    Stop,
    logit_bias_pairs,
    refused,
)
from llmengine.server.structured import (
    STRICT,
    ResponseFormat,
    StructuredOutputs,
    response_format_constraint,
)
from llmengine.server.text_stream import TextOptions
from llmengine.structured.constraint import Constraint

MAX_N = 64

TokenId = Annotated[Integer, Field(ge=0)]


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
