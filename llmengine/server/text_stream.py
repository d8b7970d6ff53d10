"""One choice's text as it grows: decoded token by token, cut at the first stop string.

`IncrementalDecoder` turns ids into text that never ends in half a UTF-8 character. On top
of that, a stop string may span several tokens, so text that could still be the start of a
stop string is held back until the next tokens show whether it is one: a stream never sends
text that a later match would have cut off. When a stop string appears, the text ends just
before it and the choice is done. The streamed pieces join into exactly `text`, which is what
a non-streamed response returns, because both are built by this class.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmengine.model.detokenizer import Decodes, IncrementalDecoder


class TextStream:
    """The text of one choice, fed one token at a time.

    `add` returns the text now safe to send ("" while it is held back), `finish` the rest at
    the end. After a stop string matched, `stopped` is True, `text` ends before the match
    and nothing more is returned. `decoded_length` is how much text the tokens so far decode
    to, held back or not: where the next token's text starts (a logprobs `text_offset`).
    """

    def __init__(self, tokenizer: Decodes, stop: Sequence[str] = ()) -> None:
        self._decoder = IncrementalDecoder(tokenizer, skip_special_tokens=True)
        self._stop = tuple(s for s in stop if s)
        self._longest = max((len(s) for s in self._stop), default=0)
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

    def add(self, token_id: int) -> str:
        """Take the next generated token; return the text it makes safe to send."""
        if self.stopped:
            return ""
        self._decoded += self._decoder.add(token_id)
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
        start = max(0, self._sent - self._longest + 1)
        matches = [i for i in (self._decoded.find(s, start) for s in self._stop) if i >= 0]
        if not matches:
            return False
        self._decoded = self._decoded[: min(matches)]
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
