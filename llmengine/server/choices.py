"""The choices of one HTTP request, as they are generated: text deltas with their logprobs.

Both endpoints come down to the same thing: some prompts, each sampled n times, every sample
an engine request whose tokens become text through a `TextStream`. A `ChoiceRun` adds
them to the engine loop all at once and yields a `Delta` whenever a choice has new text or
ends, in the order the engine produced the tokens. A choice whose text hits a stop string is
aborted in the engine there and then, so its blocks go back without waiting for max_tokens;
and whatever ends the run early (a client gone, an error) aborts the choices still running.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmengine.params import SamplingParams
from llmengine.server.engine_loop import EngineLoop, TokenEvent
from llmengine.server.text_stream import TextStream

# The engine's reasons, as OpenAI spells them: an end-of-sequence token is a stop.
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token's log-probability, its text, and the k most likely alternatives.

    `offset` is where the token's text starts in the choice's text (the legacy completions
    format's `text_offset`). Token texts are each token decoded on its own, so a token that
    holds part of a UTF-8 character reads as U+FFFD.
    """

    token: str
    logprob: float
    top: list[tuple[str, float]]
    offset: int


@dataclass(slots=True)
class Delta:
    """New text of choice `index`, the logprobs of the tokens behind it, and why it ended."""

    index: int
    text: str
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None


class _Choice:
    """One sample's text, and logprobs not yet sent because their text is held back."""

    def __init__(self, index: int, tokenizer: Any, stop: Sequence[str]) -> None:
        self.index = index
        self.text = TextStream(tokenizer, stop)
        self.pending: list[TokenLogprob] = []


class ChoiceRun:
    """The engine requests of one HTTP request, turned into deltas as their tokens arrive.

    `start` adds every (prompt, params) pair to the engine loop (choice i is pair i) and
    raises the engine's ValueError (a prompt that cannot fit) or `QueueFull` before anything
    is generated. `deltas` yields until every choice has ended; `close` aborts the choices
    still running, and the caller calls it however it finishes (a client gone, an error).
    `completion_tokens` counts every token generated.
    """

    def __init__(self, engine_loop: EngineLoop, tokenizer: Any, added: Any, stop: Sequence[str]):
        ids, self._events = added
        self._engine_loop = engine_loop
        self._choices = {rid: _Choice(i, tokenizer, stop) for i, rid in enumerate(ids)}
        self._live = set(ids)
        self._token_text = _TokenTexts(tokenizer)
        self.completion_tokens = 0

    @classmethod
    async def start(
        cls,
        engine_loop: EngineLoop,
        tokenizer: Any,
        prompts: Sequence[list[int]],
        params: Sequence[SamplingParams],
        stop: Sequence[str],
    ) -> ChoiceRun:
        return cls(engine_loop, tokenizer, await engine_loop.add(prompts, params), stop)

    @property
    def num_choices(self) -> int:
        return len(self._choices)

    async def deltas(self) -> AsyncIterator[Delta]:
        """New text or an end, choice by choice, in the order the engine made the tokens."""
        while self._live:
            event = await self._events.get()
            if isinstance(event, Exception):
                raise event
            if event.request_id not in self._live:
                continue  # a token already on its way when a stop string ended the choice
            self.completion_tokens += 1
            delta = _advance(self._choices[event.request_id], event, self._token_text)
            if delta.finish_reason is not None:
                self._live.discard(event.request_id)
                if event.finish_reason is None:  # a stop string, before the engine was done
                    self._engine_loop.abort([event.request_id], reason="stop")
            if delta.text or delta.finish_reason is not None:
                yield delta

    def close(self) -> None:
        """Abort every choice still running (none once `deltas` has run to its end)."""
        self._engine_loop.abort(sorted(self._live))
        self._live.clear()


def _advance(choice: _Choice, event: TokenEvent, token_text: _TokenTexts) -> Delta:
    """Feed one token to its choice; the delta it makes (possibly empty)."""
    offset = choice.text.decoded_length
    text = choice.text.add(event.token_id)
    if event.logprobs is not None:
        choice.pending.append(
            TokenLogprob(
                token_text(event.token_id),
                float(event.logprobs.logprob),
                [(token_text(token), float(logprob)) for token, logprob in event.logprobs.top],
                offset,
            )
        )
    reason = None
    if choice.text.stopped:
        reason = "stop"
    elif event.finish_reason is not None:
        text += choice.text.finish()
        reason = "stop" if choice.text.stopped else FINISH_REASONS[event.finish_reason]
    delta = Delta(choice.index, text, finish_reason=reason)
    if text or reason is not None:
        delta.logprobs, choice.pending = choice.pending, []
    return delta


class _TokenTexts:
    """Each token id's own text, decoded once per request."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        if token_id not in self.cache:
            self.cache[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return self.cache[token_id]
