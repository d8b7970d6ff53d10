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
from llmengine.server.engine_loop import EngineLoop, PromptEvent, TokenEvent
from llmengine.server.text_stream import TextOptions, TextStream

# The engine's reasons, as OpenAI spells them: an end-of-sequence token is a stop.
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}
# The engine's reasons for a choice ended by the token itself (an end-of-sequence, a stop
# token id): that token is scored and counted, but its text is not the choice's.
ENDED_BY_TOKEN = ("eos", "stop")


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token's log-probability, its text, and the k most likely alternatives.

    `offset` is where the token's text starts in the choice's text (the legacy completions
    format's `text_offset`). Token texts are each token decoded on its own, so a token that
    holds part of a UTF-8 character reads as U+FFFD.
    """

    token: str
    logprob: float | None  # None for a prompt's first token: nothing precedes it
    top: list[tuple[str, float]] | None
    offset: int


@dataclass(slots=True)
class Delta:
    """New text of choice `index`, the logprobs of the tokens behind it, and why it ended."""

    index: int
    text: str
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None


class _Choice:
    """One sample's text, and logprobs not yet sent because their text is held back.

    With an echo, the choice's text starts with the prompt's (`echo`), so the offsets of its
    generated tokens start after it; `prompt_logprobs` gathers the prompt's scores as the
    prefill reports them, `prompt_length - 1` in all.
    """

    def __init__(
        self,
        index: int,
        tokenizer: Any,
        options: TextOptions,
        prompt: list[int],
        echo: str | None,
        scores_prompt: bool,
    ) -> None:
        self.index = index
        self.text = TextStream(tokenizer, options)
        self.generated = 0  # tokens generated so far
        self.pending: list[TokenLogprob] = []
        self.prompt = prompt
        self.echo = echo
        self.offset_base = 0 if echo is None else len(echo)
        self.scores_prompt = scores_prompt
        self.prompt_logprobs: list[Any] = []  # llmengine.outcome.TokenLogprobs
        self.echoed = False


class ChoiceRun:
    """The engine requests of one HTTP request, turned into deltas as their tokens arrive.

    `start` adds every (prompt, params) pair to the engine loop (choice i is pair i) and
    raises the engine's ValueError (a prompt that cannot fit) or `QueueFull` before anything
    is generated. `deltas` yields until every choice has ended; `close` aborts the choices
    still running, and the caller calls it however it finishes (a client gone, an error).
    `completion_tokens` counts every token generated; `usage_of` one choice's tokens so far.
    """

    def __init__(
        self,
        engine_loop: EngineLoop,
        tokenizer: Any,
        added: Any,
        text: TextOptions,
        prompts: Sequence[list[int]],
        params: Sequence[SamplingParams],
        echo: Sequence[str] | None = None,
        only_prompt: bool = False,
    ):
        ids, self._events = added
        self._engine_loop = engine_loop
        self._tokenizer = tokenizer
        self._choices = {
            rid: _Choice(
                i, tokenizer, text, list(prompts[i]), None if echo is None else echo[i],
                scores_prompt=params[i].prompt_logprobs is not None,
            )
            for i, rid in enumerate(ids)
        }  # fmt: skip
        self._by_index = list(self._choices.values())
        self._only_prompt = only_prompt
        self._live = set(ids)
        self._token_text = _TokenTexts(tokenizer)
        self.completion_tokens = 0
        self.cached_tokens = [0] * len(ids)  # by choice: prompt tokens the prefix cache served

    @classmethod
    async def start(
        cls,
        engine_loop: EngineLoop,
        tokenizer: Any,
        prompts: Sequence[list[int]],
        params: Sequence[SamplingParams],
        text: TextOptions,
        echo: Sequence[str] | None = None,
        only_prompt: bool = False,
    ) -> ChoiceRun:
        """Add the choices, whose tokens become text as `text` says; `echo` (a text per
        choice) starts each choice's text with it, and `only_prompt` ends each choice once its
        prompt is scored, with no generated token (the engine's one is dropped): OpenAI's
        `echo` with `max_tokens: 0`."""
        added = await engine_loop.add(prompts, params)
        return cls(engine_loop, tokenizer, added, text, prompts, params, echo, only_prompt)

    def prompt_logprobs(self, index: int) -> list[Any]:
        """Choice `index`'s prompt scores so far (`TokenLogprobs`, prompt token 1 on)."""
        return self._by_index[index].prompt_logprobs

    def usage_of(self, index: int) -> tuple[int, int]:
        """Choice `index`'s prompt tokens and the tokens it has generated so far."""
        choice = self._by_index[index]
        return len(choice.prompt), choice.generated

    @property
    def num_choices(self) -> int:
        return len(self._choices)

    async def deltas(self) -> AsyncIterator[Delta]:
        """New text or an end, choice by choice, in the order the engine made the tokens; an
        echo first, once its prompt is scored (at once when no score is asked for)."""
        for choice in self._choices.values():
            if (delta := self._echo(choice)) is not None:
                yield delta
        while self._live:
            event = await self._events.get()
            if isinstance(event, Exception):
                raise event
            if event.request_id not in self._live:
                continue  # a token already on its way when a stop string ended the choice
            choice = self._choices[event.request_id]
            if isinstance(event, TokenEvent):
                self.cached_tokens[choice.index] = event.cached_tokens
            if isinstance(event, PromptEvent):
                choice.prompt_logprobs.extend(event.logprobs)
                if (delta := self._echo(choice)) is not None:
                    yield delta
                continue
            if self._only_prompt:  # the engine's one token is not part of the answer
                self._live.discard(event.request_id)
                if event.finish_reason is None:
                    self._engine_loop.abort([event.request_id], reason="length")
                yield Delta(choice.index, "", finish_reason="length")
                continue
            self.completion_tokens += 1
            choice.generated += 1
            delta = _advance(choice, event, self._token_text)
            if delta.finish_reason is not None:
                self._live.discard(event.request_id)
                if event.finish_reason is None:  # a stop string, before the engine was done
                    self._engine_loop.abort([event.request_id], reason="stop")
            if delta.text or delta.finish_reason is not None:
                yield delta

    def _echo(self, choice: _Choice) -> Delta | None:
        """The echo delta of a choice whose prompt is scored as asked, once; else None."""
        if choice.echo is None or choice.echoed:
            return None
        unscored = len(choice.prompt) - 1 - len(choice.prompt_logprobs)
        if choice.scores_prompt and unscored > 0:
            return None  # its prompt's scores are still on their way
        choice.echoed = True
        delta = Delta(choice.index, choice.echo)
        if choice.scores_prompt:
            delta.logprobs = _prompt_entries(
                choice.prompt, choice.prompt_logprobs, self._tokenizer, self._token_text
            )
        return delta

    def close(self) -> None:
        """Abort every choice still running (none once `deltas` has run to its end)."""
        self._engine_loop.abort(sorted(self._live))
        self._live.clear()


def _advance(choice: _Choice, event: TokenEvent, token_text: _TokenTexts) -> Delta:
    """Feed one token to its choice; the delta it makes (possibly empty)."""
    offset = choice.offset_base + choice.text.decoded_length
    text = choice.text.add(event.token_id, ends=event.finish_reason in ENDED_BY_TOKEN)
    if event.logprobs is not None:
        choice.pending.append(token_text.scored(event.logprobs, offset))
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


def _prompt_entries(
    prompt: list[int], scores: list[Any], tokenizer: Any, token_text: _TokenTexts
) -> list[TokenLogprob]:
    """The echoed prompt's logprobs: its first token unscored, then each scored one, with
    the offset of each token's text in the prompt's decoded text."""
    text = TextStream(tokenizer)
    entries = []
    for position, token in enumerate(prompt):
        offset = text.decoded_length
        text.add(token)
        if position == 0:
            entries.append(TokenLogprob(token_text(token), None, None, offset))
            continue
        entries.append(token_text.scored(scores[position - 1], offset))
    return entries


class _TokenTexts:
    """Each token id's own text, decoded once per request."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        if token_id not in self.cache:
            self.cache[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return self.cache[token_id]

    def scored(self, score: Any, offset: int) -> TokenLogprob:
        """An engine `TokenLogprobs` (token ids) as the server reports it (token texts)."""
        top = [(self(token), float(logprob)) for token, logprob in score.top]
        return TokenLogprob(self(score.token_id), float(score.logprob), top, offset)
