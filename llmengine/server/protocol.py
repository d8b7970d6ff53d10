"""The request bodies the server accepts, as pydantic models: POST /v1/completions' here.

The three modules of the bodies, one idea each: `llmengine.server.sampling_fields` holds what
both endpoints take (`SamplingFields`: the sampling fields, their checks, the engine's
`SamplingParams`), this module the completions body (`CompletionRequest`) and
`llmengine.server.chat_request` the chat body (`ChatCompletionRequest`); all three names are
importable from here. The completions body's defaults are OpenAI's (`max_tokens` 16, its
legacy default), plus vLLM's `add_special_tokens` and `prompt_logprobs`.

One request is at most `MAX_CHOICES` engine requests (prompts x n): everything it costs
before the engine sees it is bounded by that.

`echo` (completions) starts each choice's text with its prompt, and with `logprobs` scores
the prompt too (its first token `null`, as OpenAI does); `max_tokens: 0` then asks for the
prompt's scores alone, which is how lm-eval's loglikelihood tasks call. vLLM's
`prompt_logprobs` adds each choice's prompt scores in vLLM's format (without its `rank`).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StrictStr, ValidationInfo, field_validator, model_validator

from llmengine.params import MAX_LOGPROBS
from llmengine.server.chat_request import ChatCompletionRequest as ChatCompletionRequest
from llmengine.server.fields import REFUSED, Integer, refused
from llmengine.server.sampling_fields import SamplingFields as SamplingFields
from llmengine.server.sampling_fields import StreamOptions as StreamOptions
from llmengine.server.sampling_fields import TokenId

DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's legacy default; null in a request means this too
MAX_CHOICES = 256  # prompts x n in one request

TokenIds = Annotated[list[TokenId], Field(min_length=1)]
Text = Annotated[StrictStr, Field(min_length=1)]


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
