"""Token ids in one at a time, printable text out: what a streaming caller shows as it goes.

Decoding each token alone is wrong twice over: a byte-level BPE token may hold part of a
UTF-8 character (an emoji can be four tokens of one byte each), and some decoders drop or add
a space depending on the token before. So each new token is decoded together with the tokens
of the previous piece, and only what that adds is returned, held back while it ends in
U+FFFD (a character still incomplete). The work per token stays small however long the text
grows, and the pieces join into exactly the text of decoding all the ids at once (checked for
byte-level BPE and for words joined by spaces, in tests/test_detokenizer.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

REPLACEMENT_CHARACTER = "\ufffd"  # what a decoder writes for bytes that are not (yet) UTF-8


class Decodes(Protocol):
    """The one tokenizer method this needs (llmengine's `Tokenizer` and transformers' have it)."""

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDecoder:
    """Turns one request's generated ids, fed one at a time, into text safe to print.

    `add(token_id)` returns the new text (often "", while a character is incomplete), and
    `finish()` whatever is still held back at the end, so that the joined pieces equal
    `tokenizer.decode(token_ids, skip_special_tokens=...)`.
    """

    def __init__(self, tokenizer: Decodes, *, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.token_ids: list[int] = []
        # token_ids[prefix_offset:read_offset] produced the last piece returned: the context
        # the next tokens are decoded in. Everything from read_offset on is not returned yet.
        self.prefix_offset = 0
        self.read_offset = 0

    def add(self, token_id: int) -> str:
        """Take the next generated id; return the text it completes ("" if none yet)."""
        self.token_ids.append(token_id)
        prefix_text = self._decode(self.prefix_offset, self.read_offset)
        text = self._decode(self.prefix_offset, len(self.token_ids))
        if len(text) <= len(prefix_text) or text.endswith(REPLACEMENT_CHARACTER):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        return text[len(prefix_text) :]

    def finish(self) -> str:
        """The text still held back (an incomplete character stays as U+FFFD, as in decode)."""
        prefix_text = self._decode(self.prefix_offset, self.read_offset)
        text = self._decode(self.prefix_offset, len(self.token_ids))
        self.prefix_offset = self.read_offset = len(self.token_ids)
        return text[len(prefix_text) :]

    def _decode(self, start: int, end: int) -> str:
        return self.tokenizer.decode(
            self.token_ids[start:end], skip_special_tokens=self.skip_special_tokens
        )
