"""TextStream: stop strings cut the text, across tokens; held-back text is never lost; a matched
stop string kept on request; none counting before min_tokens."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

import llmengine
from llmengine.server.text_stream import TextOptions, TextStream


class Letters:
    """A tokenizer whose token i is the i-th string of `vocab`: tokens of known text."""

    def __init__(self, vocab: Sequence[str]) -> None:
        self.vocab = list(vocab)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.vocab[i] for i in token_ids)

    def ids(self, *pieces: str) -> list[int]:
        return [self.vocab.index(piece) for piece in pieces]


LETTERS = Letters(["ab", "c", "d", "x", "e", "cd", "abc"])


def feed(stream: TextStream, ids: list[int]) -> list[str]:
    pieces = [stream.add(token) for token in ids]
    return [*pieces, stream.finish()]


def test_a_stop_string_spanning_tokens_cuts_before_it() -> None:
    stream = TextStream(LETTERS, stop=["bcd"])
    pieces = feed(stream, LETTERS.ids("x", "ab", "c", "d", "e"))
    assert pieces == ["x", "a", "", "", "", ""]
    assert stream.stopped and stream.text == "xa"


def test_text_held_back_for_a_possible_stop_comes_out_when_it_is_not_one() -> None:
    stream = TextStream(LETTERS, stop=["cde"])
    pieces = feed(stream, LETTERS.ids("ab", "c", "d", "x"))
    assert pieces == ["ab", "", "", "cdx", ""]
    assert not stream.stopped and stream.text == "abcdx"


def test_held_back_text_is_released_at_the_end() -> None:
    stream = TextStream(LETTERS, stop=["cde"])
    pieces = feed(stream, LETTERS.ids("ab", "cd"))
    assert pieces == ["ab", "", "cd"] and stream.text == "abcd"


def test_the_earliest_stop_wins_and_a_stop_at_the_very_start_leaves_nothing() -> None:
    stream = TextStream(LETTERS, stop=["d", "bc"])
    assert "".join(feed(stream, LETTERS.ids("abc", "d"))) == "a"
    stream = TextStream(LETTERS, stop=["ab"])
    assert feed(stream, LETTERS.ids("abc", "d")) == ["", "", ""] and stream.text == ""


def test_after_a_stop_nothing_more_comes_out() -> None:
    stream = TextStream(LETTERS, stop=["x"])
    assert stream.add(LETTERS.ids("x")[0]) == "" and stream.stopped
    assert stream.add(LETTERS.ids("ab")[0]) == "" and stream.finish() == ""


@pytest.mark.parametrize("stop", [(), ("\n\n",), (" the ", "ROMEO")])
def test_the_pieces_join_into_the_decoded_text_on_the_real_tokenizer(
    stop: tuple[str, ...],
) -> None:
    tokenizer = llmengine.load_tokenizer()
    text = "ROMEO:\nO, the heart é 🎭 of it!\n\nJULIET: the end"
    ids = tokenizer.encode(text, add_special_tokens=False)
    stream = TextStream(tokenizer, stop=stop)
    pieces = feed(stream, ids)
    decoded = tokenizer.decode(ids, skip_special_tokens=True)
    cut = min((decoded.find(s) for s in stop if s in decoded), default=len(decoded))
    assert "".join(pieces) == stream.text == decoded[:cut]
    assert all("\ufffd" not in piece for piece in pieces)
    assert stream.decoded_length >= len(stream.text)


def test_include_stop_keeps_the_matched_stop_string_and_ends_there() -> None:
    stream = TextStream(LETTERS, TextOptions(("bcd",), include_stop=True))
    pieces = feed(stream, LETTERS.ids("x", "ab", "c", "d", "e"))
    assert "".join(pieces) == stream.text == "xabcd" and stream.stopped


def test_no_stop_string_counts_in_the_text_of_the_first_min_tokens_minus_one_tokens() -> None:
    ids = LETTERS.ids("x", "d", "c", "d", "e")
    stream = TextStream(LETTERS, TextOptions(("d",), min_tokens=3))
    pieces = feed(stream, ids)
    # "xd" (two tokens) goes out unsearched; token 3 on is searched: the second "d" stops it.
    assert pieces[:2] == ["x", "d"] and stream.text == "xdc" and stream.stopped
    # A stop string that starts in the unsearched text does not count either.
    stream = TextStream(LETTERS, TextOptions(("dc",), min_tokens=3))
    assert "".join(feed(stream, ids)) == "xdcde" and not stream.stopped


def test_the_token_that_ends_a_choice_writes_nothing_unless_include_stop() -> None:
    # "x" stands for an end-of-sequence or stop token id; "c" is held back for "cde".
    stream = TextStream(LETTERS, TextOptions(("cde",), skip_special_tokens=False))
    pieces = [stream.add(token) for token in LETTERS.ids("ab", "c")]
    pieces += [stream.add(LETTERS.ids("x")[0], ends=True), stream.finish()]
    assert pieces == ["ab", "", "", "c"] and stream.text == "abc"
    kept = TextStream(LETTERS, TextOptions(("cde",), include_stop=True))
    assert [kept.add(token) for token in LETTERS.ids("ab", "c")] == ["ab", ""]
    assert kept.add(LETTERS.ids("x")[0], ends=True) + kept.finish() == "cx"
    assert kept.text == "abcx"
