"""`load_tokenizer` reads tokenizer.json itself and gives transformers' ids and text.

That loading the embedded tokenizer imports no transformers is checked with the whole
start-up of `llmengine generate`, in test_cli.py.
"""

import json
import random
from pathlib import Path

import pytest
from hf_llama import save_word_level_tokenizer
from transformers import AutoTokenizer

import llmengine
from llmengine.model.tokenizer import Tokenizer, load_tokenizer

WORDS = ["<unk>", "<s>", "</s>", "to", "be", "or", "not", "that", "is", "the", "question"]

TEXTS = [
    "",
    " ",
    "ROMEO:\nBut soft, what light through yonder window breaks?\n",
    "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\n\n[Exeunt.]\n",
    "Nay, 'tis twenty past nine; the café's closed.",
    "Ça va? Señor Müller's naïve façade, Ægir in Łódź, smörgåsbord, São Tomé",
    "Καλημέρα κόσμε. Привет, мир. 日本語のテキスト. مرحبا بالعالم. नमस्ते",
    "😀 👍🏽 🇫🇷 👩‍👩‍👧 ❤️ 🎭 — “curly quotes” … ½ € £ ©",
    "\t x  \n",
    "\n\n\n   leading and trailing   ",
    "<|endoftext|>",
    "to be<|endoftext|>or not<pad> to be",
    "<pad><pad> <|endoftext|> <s></s>",
    "x = [1, 2, 3]; print(x ** 2)  # 3.14159e-10",
    "https://example.com/?q=a&b=c#anchor",
    "\x00\x01\x7f \u200b zero\u00a0width \ufffd replacement",
    "to be or not to be that is the question",
    "to  be\tor\nnot",
]


def random_texts(count: int, seed: int = 0) -> list[str]:
    """Strings drawn from ASCII, Latin-1, Greek, CJK, emoji and the odd control character."""
    rng = random.Random(seed)
    ranges = [(0x20, 0x7E), (0x09, 0x0A), (0xA0, 0xFF), (0x391, 0x3C9), (0x4E00, 0x4E80)]
    ranges.append((0x1F600, 0x1F64F))
    texts = []
    for _ in range(count):
        chars = [chr(rng.randint(*rng.choice(ranges))) for _ in range(rng.randint(1, 40))]
        texts.append("".join(chars))
    return texts


@pytest.fixture(scope="module", params=["embedded", "word-level"])
def folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if request.param == "embedded":
        return llmengine.embedded_model_path()
    folder = tmp_path_factory.mktemp("word-level")
    save_word_level_tokenizer(folder, WORDS)
    return folder


@pytest.fixture(scope="module")
def ours(folder: Path) -> Tokenizer:
    tokenizer = load_tokenizer(folder)
    assert isinstance(tokenizer, Tokenizer)
    return tokenizer


@pytest.fixture(scope="module")
def reference(folder: Path):
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def test_encode_gives_transformers_ids(ours: Tokenizer, reference) -> None:
    for text in TEXTS + random_texts(200):
        assert ours.encode(text) == reference.encode(text), repr(text)
        assert ours.encode(text, add_special_tokens=False) == reference.encode(
            text, add_special_tokens=False
        ), repr(text)


@pytest.mark.parametrize("skip_special_tokens", [False, True])
def test_decode_gives_transformers_text(ours: Tokenizer, reference, skip_special_tokens) -> None:
    rng = random.Random(1)
    vocab_size = ours.backend.get_vocab_size()
    sequences = [[i] for i in range(vocab_size)]
    sequences += [
        [rng.randrange(vocab_size) for _ in range(rng.randint(1, 64))] for _ in range(300)
    ]
    sequences += [ours.encode(text) for text in TEXTS]
    for ids in sequences:
        expected = reference.decode(ids, skip_special_tokens=skip_special_tokens)
        assert ours.decode(ids, skip_special_tokens=skip_special_tokens) == expected, ids


def test_decode_takes_one_id_or_a_tensor_row(ours: Tokenizer) -> None:
    import torch

    ids = ours.encode("to be or not")
    assert ours.decode(torch.tensor(ids)) == ours.decode(ids)
    assert ours.decode(ids[-1]) == ours.decode([ids[-1]])


def test_special_tokens_and_their_ids_are_transformers(ours: Tokenizer, reference) -> None:
    for role in ("bos", "eos", "unk", "pad"):
        assert getattr(ours, f"{role}_token") == getattr(reference, f"{role}_token"), role
        assert getattr(ours, f"{role}_token_id") == getattr(reference, f"{role}_token_id"), role
    tokens = ["<|endoftext|>", "<pad>", "<s>", "</s>", "to", "Ġthe", "no-such-token"]
    assert ours.convert_tokens_to_ids(tokens) == reference.convert_tokens_to_ids(tokens)
    assert ours.convert_tokens_to_ids("to") == reference.convert_tokens_to_ids("to")


def test_a_folder_without_tokenizer_json_falls_back_to_transformers(tmp_path: Path) -> None:
    """Only vocab.json and merges.txt (the embedded vocabulary, as a GPT-2 tokenizer)."""
    backend = json.loads((llmengine.embedded_model_path() / "tokenizer.json").read_text())
    (tmp_path / "vocab.json").write_text(json.dumps(backend["model"]["vocab"]))
    merges = [" ".join(pair) for pair in backend["model"]["merges"]]
    (tmp_path / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    config = {"tokenizer_class": "GPT2Tokenizer", "eos_token": "<|endoftext|>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = load_tokenizer(tmp_path)
    assert not isinstance(tokenizer, Tokenizer)
    text = "ROMEO: café 😀"
    assert tokenizer.encode(text) == load_tokenizer().encode(text, add_special_tokens=False)


def test_a_special_token_missing_from_the_vocabulary_falls_back_to_transformers(
    tmp_path: Path,
) -> None:
    """transformers adds a named special token that tokenizer.json lacks, as a new id: reading
    tokenizer.json alone would give other ids, so transformers loads this folder."""
    embedded = llmengine.embedded_model_path()
    (tmp_path / "tokenizer.json").write_text((embedded / "tokenizer.json").read_text())
    config = json.loads((embedded / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "unk_token": "<unk>"}))
    tokenizer = load_tokenizer(tmp_path)
    assert not isinstance(tokenizer, Tokenizer)
    assert tokenizer.encode("to <unk>")[-1] == tokenizer.unk_token_id == 2048


def test_a_missing_folder_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path / "nowhere")
