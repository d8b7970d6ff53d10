"""`IncrementalDecoder`: pieces that are safe to print and join into the full decode."""

import random

import pytest
from tokenizers import Tokenizer as Backend
from tokenizers import models, pre_tokenizers

import llmengine
from llmengine.model.detokenizer import REPLACEMENT_CHARACTER, IncrementalDecoder
from llmengine.model.tokenizer import Tokenizer

TEXTS = [
    "ROMEO:\nBut soft, what light through yonder window breaks?\n",
    "Nay, 'tis twenty past nine; the café's closed.",
    "Ça va? Señor Müller's naïve façade, Ægir in Łódź",
    "Καλημέρα κόσμε. Привет, мир. 日本語のテキスト. مرحبا",
    "😀 👍🏽 🇫🇷 👩‍👩‍👧 — “curly quotes” … ½ €",
    "<|endoftext|>to be<pad> or not\n\n\t to be \ufffd",
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return llmengine.load_tokenizer()


def stream(tokenizer, token_ids: list[int], skip_special_tokens: bool = True) -> list[str]:
    """Every piece an `IncrementalDecoder` returns for `token_ids`, `finish()` last."""
    decoder = IncrementalDecoder(tokenizer, skip_special_tokens=skip_special_tokens)
    return [decoder.add(token_id) for token_id in token_ids] + [decoder.finish()]


def test_pieces_of_real_text_join_into_it(tokenizer: Tokenizer) -> None:
    for text in TEXTS:
        ids = tokenizer.encode(text)
        pieces = stream(tokenizer, ids, skip_special_tokens=False)
        assert "".join(pieces) == tokenizer.decode(ids)
        assert "".join(stream(tokenizer, ids)) == tokenizer.decode(ids, skip_special_tokens=True)


def test_a_character_split_over_tokens_comes_out_whole(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("😀", add_special_tokens=False)
    assert len(ids) > 1, "the emoji is one token here: choose a rarer character"
    assert tokenizer.decode(ids[:1]).endswith(REPLACEMENT_CHARACTER)
    assert stream(tokenizer, ids) == [""] * (len(ids) - 1) + ["😀", ""]


def test_no_piece_ends_in_half_a_character(tokenizer: Tokenizer) -> None:
    for text in TEXTS:
        pieces = stream(tokenizer, tokenizer.encode(text))
        held = sum(piece == "" for piece in pieces[:-1])
        assert not any(piece.endswith(REPLACEMENT_CHARACTER) for piece in pieces[:-1]), pieces
        assert held > 0 or text.isascii(), "nothing was ever held back in this text"


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_random_token_sequences_join_into_their_decode(
    tokenizer: Tokenizer, skip_special_tokens: bool
) -> None:
    """Any ids at all: lone bytes of characters, bytes that never form one, special tokens."""
    rng = random.Random(0)
    vocab_size = tokenizer.backend.get_vocab_size()
    for _ in range(500):
        ids = [rng.randrange(vocab_size) for _ in range(rng.randint(1, 48))]
        pieces = stream(tokenizer, ids, skip_special_tokens)
        expected = tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        assert "".join(pieces) == expected, ids
        assert not any(piece.endswith(REPLACEMENT_CHARACTER) for piece in pieces[:-1]), ids


def test_an_unfinished_character_at_the_end_is_what_decode_gives(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("to be 😀", add_special_tokens=False)[:-1]
    pieces = stream(tokenizer, ids)
    assert pieces[-1].endswith(REPLACEMENT_CHARACTER)
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True)


def test_a_decoder_that_joins_words_with_spaces() -> None:
    """No decoder in tokenizer.json: decode puts a space between tokens, never at a skipped one."""
    words = ["<unk>", "<s>", "</s>", "to", "be", "or", "not"]
    backend = Backend(models.WordLevel({word: i for i, word in enumerate(words)}, "<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens(words[:3])
    tokenizer = Tokenizer(backend, {"bos_token": "<s>", "eos_token": "</s>"})
    rng = random.Random(1)
    for _ in range(300):
        ids = [rng.randrange(len(words)) for _ in range(rng.randint(1, 12))]
        for skip in (True, False):
            expected = tokenizer.decode(ids, skip_special_tokens=skip)
            assert "".join(stream(tokenizer, ids, skip)) == expected, ids
