"""How some request fields are read, and which fields are accepted unused or refused.

Integers: JSON Schema counts `63.0` an integer, so every integer field takes an integral
float as that integer, while `"2"` and `2.5` stay refused (`Integer`). Stop strings: at most
`MAX_STOP` non-empty ones, each refusal saying which rule it broke. `logit_bias`: OpenAI's
object of token ids written as decimal strings to biases in [-100, 100], handed to the
engine as `(token id, bias)` pairs.

`UNUSED` names the fields accepted and not used: they only do bookkeeping (`user`,
`metadata`, ...) or ask for what this server does anyway (`priority`: admission is first
come, first served). `REFUSED` names fields that would silently change the answer if
ignored: each is a 400 naming it and why, unless it holds the value that asks for nothing
(`best_of` equal to n, `suffix` empty, `use_beam_search` false, ...).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, StrictInt, StrictStr

MAX_STOP = 16
MAX_LOGIT_BIAS = 100.0
_TOKEN_ID = re.compile(r"0|[1-9][0-9]*")

UNUSED = frozenset(
    {
        "user",  # OpenAI's abuse monitoring
        "store",  # OpenAI's stored completions
        "metadata",  # tags for stored completions
        "service_tier",  # OpenAI's processing tiers
        "priority",  # vLLM's priority scheduling: admission here is first come, first served
        "reasoning_effort",  # for reasoning models; no template here reads it
        "prediction",  # predicted outputs only make an answer faster, never different
        "stream_options.include_obfuscation",  # no obfuscation field is ever sent
    }
)

REFUSED = {
    "best_of": "this server does not rank candidate samples; send null, or n's value",
    "suffix": 'this server does not insert text (fill in the middle); send null or ""',
    "use_beam_search": "this server does not do beam search; send false",
    "length_penalty": "only beam search uses it, and this server does not do beam search; send 1.0",
    "functions": "deprecated by OpenAI and not supported here: send tools",
    "function_call": "deprecated by OpenAI and not supported here: send tool_choice",
    "audio": "this server generates text only",
    "modalities": 'this server generates text only; send ["text"]',
}


def _integral(value: Any) -> Any:
    """An integral float (63.0) as its integer; anything else as it is, for the int check."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Integer = Annotated[StrictInt, BeforeValidator(_integral)]


def _checked_stop(value: str | list[str]) -> str | list[str]:
    strings = [value] if isinstance(value, str) else value
    if len(strings) > MAX_STOP:
        raise ValueError(f"at most {MAX_STOP} stop strings, got {len(strings)}")
    if not all(strings):
        raise ValueError("a stop string may not be empty")
    return value


Stop = Annotated[StrictStr | list[StrictStr], AfterValidator(_checked_stop)]


def _checked_logit_bias(value: dict[str, float]) -> dict[str, float]:
    for key, bias in value.items():
        if not _TOKEN_ID.fullmatch(key):
            raise ValueError(f"the key {key!r} is not a token id (a decimal integer string)")
        if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
            raise ValueError(
                f"token {key}'s bias {bias} is outside [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]"
            )
    return value


LogitBias = Annotated[dict[StrictStr, float], AfterValidator(_checked_logit_bias)]


def logit_bias_pairs(value: dict[str, float]) -> tuple[tuple[int, float], ...]:
    """OpenAI's `logit_bias` object as the engine takes it: (token id, bias), by token id."""
    return tuple(sorted((int(token), float(bias)) for token, bias in value.items()))


def _neutral(value: Any, neutral: tuple[Any, ...]) -> bool:
    """Whether `value` is one of `neutral`, type and all (0 is not False, 1 is 1.0)."""
    numbers = (int, float)
    for candidate in neutral:
        same_kind = type(value) is type(candidate) or (
            isinstance(value, numbers)
            and isinstance(candidate, numbers)
            and not isinstance(value, bool)
            and not isinstance(candidate, bool)
        )
        if same_kind and value == candidate:
            return True
    return False


def refused(name: str, *neutral: Any) -> Any:
    """The type of a field in `REFUSED`: any JSON value, a 400 saying why unless it is one
    of `neutral` (None always is)."""

    def check(value: Any) -> Any:
        if value is not None and not _neutral(value, neutral):
            raise ValueError(REFUSED[name])
        return value

    return Annotated[Any, AfterValidator(check)]
