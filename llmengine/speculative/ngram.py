"""Prompt lookup: guess what follows by finding the last few tokens earlier in the request.

Text repeats itself (code, quotes, a model in a loop), and where the last n tokens occurred
before, what followed them then is a fair guess at what follows now. The proposer tries the
longest n first, takes the most recent earlier occurrence, and proposes up to k of the
tokens that followed it. It costs a scan of the request's own tokens, no forward at all, and
proposes nothing when no suffix recurs.
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_NGRAM = 4  # the longest suffix looked up
MIN_NGRAM = 1  # the shortest


def propose_ngram(
    token_ids: Sequence[int], k: int, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM
) -> list[int]:
    """Up to `k` tokens that followed the latest earlier occurrence of the longest suffix of
    `token_ids` (from `max_ngram` down to `min_ngram` tokens) that occurs earlier; [] if none."""
    tokens = list(token_ids)
    length = len(tokens)
    if k < 1:
        return []
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        suffix = tokens[length - n :]
        first = suffix[0]
        # Latest start first; the match may overlap the suffix but must end before it does.
        for start in range(length - n - 1, -1, -1):
            if tokens[start] == first and tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []
