"""One choice's text as it grows: decoded token by token, cut at the first stop string.

`IncrementalDecoder` turns ids into text that never ends in half a UTF-8 character (special
tokens left out unless `skip_special_tokens` is false). On top of that, a stop string may
span several tokens, so text that could still be the start of a stop string is held back
until the next tokens show whether it is one: a stream never sends text that a later match
would have cut off. When a stop string appears, the text ends just before it (just after it
with `include_stop`) and the choice is done. Likewise the token id that ended a choice (its
end-of-sequence, a stop token id) writes nothing, unless `include_stop`. As in vLLM, no stop
string counts before `min_tokens` tokens exist: the text of the first `min_tokens - 1`
tokens is sent as it comes and never searched. The streamed pieces join into exactly
`text`, which is what a non-streamed response returns, because both are built by this class.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmengine.model.detokenizer import Decodes, IncrementalDecoder


@dataclass(frozen=True, slots=True)
class TextOptions:
    """How a request's tokens become its text: stop strings, whether a matched one stays in
    the text, whether special tokens are written, and the tokens before which no stop string
    counts (the request's `min_tokens`)."""

    stop: tuple[str, ...] = ()
    include_stop: bool = False
    skip_special_tokens: bool = True
    min_tokens: int = 0


class TextStream:
    """The text of one choice, fed one token at a time, with its stop strings (or all of its
    `TextOptions`).

    `add` returns the text now safe to send ("" while it is held back), `finish` the rest at
    the end. After a stop string matched, `stopped` is True, `text` ends before the match
    (after it with `include_stop`) and nothing more is returned. `decoded_length` is how much
    text the tokens so far decode to, held back or not: where the next token's text starts
    (a logprobs `text_offset`).
    """

    def __init__(self, tokenizer: Decodes, stop: Sequence[str] | TextOptions = ()) -> None:
        options = stop if isinstance(stop, TextOptions) else TextOptions(tuple(stop))
        self._decoder = IncrementalDecoder(
            tokenizer, skip_special_tokens=options.skip_special_tokens
        )
        self._stop = tuple(s for s in options.stop if s)
        self._longest = max((len(s) for s in self._stop), default=0)
        self._include_stop = options.include_stop
        self._unsearched_tokens = max(options.min_tokens - 1, 0)
        self._search_from = 0  # where a stop string may start: after the unsearched text
        self._decoded = ""  # everything decoded so far, up to the stop string once matched
        self._sent = 0  # how much of it has been returned
        self.stopped = False

    @property
    def text(self) -> str:
        """The text returned so far (all of it, once the choice is done)."""
        return self._decoded[: self._sent]

    @property
    def decoded_length(self) -> int:
        return len(self._decoded)

    def add(self, token_id: int, *, ends: bool = False) -> str:
        """Take the next generated token; return the text it makes safe to send. A token
        that `ends` the choice (an end-of-sequence or stop token id) adds no text unless
        `include_stop`, as in vLLM: a choice's text never holds the token that stopped it,
        even with `skip_special_tokens` false."""
        if self.stopped or (ends and not self._include_stop):
            return ""
        self._decoded += self._decoder.add(token_id)
        if self._unsearched_tokens > 0:  # before min_tokens: no stop string counts yet
            self._unsearched_tokens -= 1
            self._search_from = len(self._decoded)
            return self._send(len(self._decoded))
        return self._release(final=False)

    def finish(self) -> str:
        """The text still held back, once no token will follow."""
        if self.stopped:
            return ""
        self._decoded += self._decoder.finish()
        return self._release(final=True)

    def _release(self, *, final: bool) -> str:
        if self._stop and self._cut_at_stop():
            return self._send(len(self._decoded))
        end = len(self._decoded) if final else len(self._decoded) - self._held_back()
        return self._send(max(end, self._sent))

    def _cut_at_stop(self) -> bool:
        """Cut the text at the earliest stop string; True if there was one."""
        # A match can only involve text after what was sent, or straddle its last characters.
        start = max(self._search_from, self._sent - self._longest + 1)
        matches = [(i, s) for s in self._stop if (i := self._decoded.find(s, start)) >= 0]
        if not matches:
            return False
        where, stop = min(matches)
        self._decoded = self._decoded[: where + len(stop) if self._include_stop else where]
        self.stopped = True
        return True

    def _held_back(self) -> int:
        """Length of the longest tail of the text that some stop string starts with."""
        tail_max = min(self._longest - 1, len(self._decoded) - self._sent)
        for length in range(tail_max, 0, -1):
            tail = self._decoded[-length:]
            if any(s.startswith(tail) for s in self._stop):
                return length
        return 0

    def _send(self, end: int) -> str:
        piece = self._decoded[self._sent : end]
        self._sent = end
        return piece
