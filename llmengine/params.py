"""What a caller asks of a request, the prompt it may ask about, and the rule that says when
it is done.

Plain data with no tensors, so the request lifecycle and the scheduler can hold sampling
parameters and apply the stop rule without importing the sampler.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from llmengine.structured.constraint import Constraint

FinishReason = Literal["length", "stop", "eos"]
_MAX_SEED = 2**64 - 1
MAX_LOGPROBS = 20  # the most alternatives a request may ask for, as in OpenAI's API
# Below this a temperature divides float32 logits past what their range and resolution
# honour (1e-38 overflows them to inf, and sampling turns to noise); 0 is greedy.
MIN_TEMPERATURE = 1e-3
# Above this (float32's largest number) a temperature is infinite to the float32 logits it
# divides, and -inf / inf is NaN: the tokens a grammar masks out would come back.
MAX_TEMPERATURE = 3.4028234663852886e38
# A repetition penalty divides or multiplies float32 logits: outside this range it rounds
# them to 0 or to inf.
REPETITION_PENALTY_RANGE = (1e-2, 1e2)
# OpenAI's range for a logit bias: -100 bans a token, +100 all but forces it.
LOGIT_BIAS_LIMIT = 100.0


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """What one request asks of the sampler.

    - `max_tokens`: the most tokens to generate (at least 1).
    - `temperature`: 0.0 is greedy (argmax); from `MIN_TEMPERATURE` to `MAX_TEMPERATURE` the
      logits are divided by it and sampled.
    - `top_k`: keep only the k most likely tokens; 0 keeps all.
    - `top_p`: keep the smallest set of most likely tokens whose probability reaches top_p.
    - `min_p` (in [0, 1]): after temperature, drop every token whose probability is below
      min_p times the most likely token's (vLLM's definition; before top-k and top-p, which
      then renormalise over what it keeps). Greedy ignores it: the argmax always stays.
    - `seed`: draw from a private generator seeded with this, for reproducible samples.
    - `stop_token_ids`: tokens that finish the request (the token is kept in the output).
    - `ignore_eos`: keep going past the model's end-of-sequence tokens.
    - `min_tokens` (in [0, max_tokens]): until this many tokens are generated, the model's
      end-of-sequence tokens and `stop_token_ids` cannot be drawn (their logits are -inf,
      as in vLLM, which masks the end tokens even with `ignore_eos`).
    - `logit_bias`: (token id, bias) pairs, bias in [-100, 100], added to the raw logits
      before anything else, greedy rows included (OpenAI's definition: -100 bans a token,
      +100 all but forces it). Any mapping or iterable of pairs is accepted and kept as a
      tuple sorted by id; ids beyond the model's vocabulary are refused by the engine.
    - `presence_penalty`, `frequency_penalty` (in [-2, 2]): subtracted from the logit of every
      token already generated, once, or once per occurrence (OpenAI's definitions).
    - `repetition_penalty` (in [0.01, 100], 1 is off): divides a positive logit, multiplies a
      negative one, of every token in the prompt or the output (vLLM's and transformers'
      definition).
    - `logprobs`: None, or k in [0, 20]: report the sampled token's log-probability and the k
      most likely alternatives at every position.
    - `prompt_logprobs`: None, or k in [0, 20]: the same for every prompt token after the
      first (what the model thought of the prompt), computed by the prefill. Such a request
      takes no prefix-cache hits: a cached block is never computed, so it has no logits.
    - `constraint`: None, or a `Constraint` the output must match (a JSON schema, any JSON
      object, a regular expression, a choice, a grammar); tokens it refuses are masked out
      before sampling, and the request ends on an end-of-sequence token once it is complete,
      so it cannot be combined with `ignore_eos`.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    constraint: Constraint | None = None

    def __post_init__(self) -> None:
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.temperature, int | float) or not math.isfinite(self.temperature):
            raise ValueError(f"temperature must be a finite number, got {self.temperature!r}")
        if 0 < self.temperature < MIN_TEMPERATURE or self.temperature < 0:
            raise ValueError(
                f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE}, "
                f"got {self.temperature}"
            )
        if self.temperature > MAX_TEMPERATURE:
            raise ValueError(
                f"temperature must be at most {MAX_TEMPERATURE:.4g} (float32's largest number), "
                f"got {self.temperature}"
            )
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 keeps all), got {self.top_k!r}")
        if not isinstance(self.top_p, int | float) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_number(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be a number in [0, 1], got {self.min_p!r}")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed <= _MAX_SEED):
            raise ValueError(f"seed must be an integer in [0, 2**64), got {self.seed!r}")
        stop = tuple(self.stop_token_ids)
        if not all(_is_int(token) and token >= 0 for token in stop):
            raise ValueError(f"stop_token_ids must be non-negative integers, got {stop!r}")
        object.__setattr__(self, "stop_token_ids", stop)
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"min_tokens must be an integer in [0, max_tokens={self.max_tokens}], "
                f"got {self.min_tokens!r}"
            )
        object.__setattr__(self, "logit_bias", _normalised_logit_bias(self.logit_bias))
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be a number in [-2, 2], got {value!r}")
        low, high = REPETITION_PENALTY_RANGE
        if not _is_number(self.repetition_penalty) or not low <= self.repetition_penalty <= high:
            raise ValueError(
                f"repetition_penalty must be a number in [{low:g}, {high:g}] (1 is off), "
                f"got {self.repetition_penalty!r}"
            )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or not 0 <= value <= MAX_LOGPROBS):
                raise ValueError(
                    f"{name} must be None or an integer in [0, {MAX_LOGPROBS}], got {value!r}"
                )
        if self.constraint is not None and not isinstance(self.constraint, Constraint):
            raise ValueError(f"constraint must be a Constraint, got {self.constraint!r}")
        if self.constraint is not None and self.ignore_eos:
            raise ValueError(
                "a constrained request ends on an end-of-sequence token once its output is "
                "complete; ignore_eos would run it past its grammar"
            )

    @property
    def has_penalties(self) -> bool:
        """True when any penalty changes the logits before sampling."""
        return bool(self.presence_penalty or self.frequency_penalty) or (
            self.repetition_penalty != 1.0
        )

    @property
    def adjusts_logits(self) -> bool:
        """True when the logits change before the draw in a way that can move the argmax:
        a logit bias, a minimum length or a penalty (such a row leaves the greedy fast path)."""
        return bool(self.logit_bias) or self.min_tokens > 0 or self.has_penalties

    @property
    def greedy(self) -> bool:
        """True when the next token is the argmax, with no randomness at all."""
        return self.temperature == 0.0

    @property
    def plain_greedy(self) -> bool:
        """True when the raw logits' argmax is all a row needs: greedy, nothing that adjusts
        the logits, no constraint, no logprobs (a decode graph's greedy picks serve it)."""
        return (
            self.greedy
            and not self.adjusts_logits
            and self.constraint is None
            and self.logprobs is None
        )


def _normalised_logit_bias(
    bias: Mapping[int, float] | Iterable[tuple[int, float]],
) -> tuple[tuple[int, float], ...]:
    """`bias` as (token id, bias) pairs sorted by id, once every id is an integer >= 0 that
    appears once and every bias a number in [-100, 100]; ValueError naming what is wrong."""
    try:
        pairs = [tuple(pair) for pair in (bias.items() if isinstance(bias, Mapping) else bias)]
    except TypeError:
        raise ValueError(
            f"logit_bias must map token ids to biases (or be (id, bias) pairs), got {bias!r}"
        ) from None
    for pair in pairs:
        if len(pair) != 2 or not _is_int(pair[0]) or pair[0] < 0:
            raise ValueError(f"logit_bias keys must be token ids (integers >= 0), got {pair!r}")
        if not _is_number(pair[1]) or not -LOGIT_BIAS_LIMIT <= pair[1] <= LOGIT_BIAS_LIMIT:
            raise ValueError(
                f"logit_bias of token {pair[0]} must be a number in [-100, 100], got {pair[1]!r}"
            )
    counts = Counter(token for token, _ in pairs)
    repeated = sorted(token for token, count in counts.items() if count > 1)
    if repeated:
        raise ValueError(f"logit_bias names token ids more than once: {repeated}")
    return tuple(sorted((token, float(value)) for token, value in pairs))


def check_prompt(prompt_token_ids: Sequence[int], vocab_size: int) -> list[int]:
    """The prompt as a list of ints, once it is known to hold a token and only ids the model has.

    ValueError for an empty prompt or for ids outside `[0, vocab_size)` (the first five named):
    the embedding would index out of range on such an id.
    """
    prompt = [int(token) for token in prompt_token_ids]
    if not prompt:
        raise ValueError("the prompt is empty: a request needs at least one token")
    outside = [token for token in prompt if not 0 <= token < vocab_size]
    if outside:
        raise ValueError(f"token ids outside the vocabulary [0, {vocab_size}): {outside[:5]}")
    return prompt


def check_logit_bias(params: SamplingParams, vocab_size: int) -> None:
    """ValueError naming the `logit_bias` ids outside `[0, vocab_size)` (the first five): the
    bias would index past the logits. `SamplingParams` cannot check it, not knowing the model."""
    outside = [token for token, _ in params.logit_bias if token >= vocab_size]
    if outside:
        raise ValueError(
            f"logit_bias token ids outside the vocabulary [0, {vocab_size}): {outside[:5]}"
        )


def finish_reason(
    params: SamplingParams,
    num_generated: int,
    token_id: int,
    eos_token_ids: Sequence[int] = (),
) -> FinishReason | None:
    """Why a request is done after generating `token_id` as its `num_generated`-th token.

    Returns "length" when the budget is spent (checked first: a full budget is the reason a
    caller should see), "stop" for one of the request's stop tokens, "eos" for one of the
    model's end-of-sequence tokens unless `ignore_eos`, and None to keep going. The finishing
    token itself belongs to the output.
    """
    if num_generated >= params.max_tokens:
        return "length"
    if token_id in params.stop_token_ids:
        return "stop"
    if not params.ignore_eos and token_id in eos_token_ids:
        return "eos"
    return None
