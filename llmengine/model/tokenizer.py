"""The checkpoint's own tokenizer, loaded offline from its folder.

Tokenization is not what this engine teaches, so it reuses a library: `tokenizers` reads the
folder's `tokenizer.json` directly (a few milliseconds; transformers would add about two
seconds of imports to every start). transformers' `AutoTokenizer` is the fallback for a
folder without tokenizer.json, or one whose tokenizer transformers changes with logic of its
own (see `reads_like_transformers`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tokenizers

from llmengine.model.loader import model_folder

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
# The classes transformers uses to wrap a tokenizer.json as it is (4.x and 5.x names).
GENERIC_CLASSES = (None, "PreTrainedTokenizerFast", "TokenizersBackend")
# transformers' named special tokens; any of them may appear in tokenizer_config.json.
SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


class Tokenizer:
    """Text to token ids and back, with the same ids and text as transformers' tokenizer.

    The methods are the part of transformers' interface this project uses: `encode` (special
    tokens such as a BOS added by the post-processor, as transformers does), `decode`,
    `convert_tokens_to_ids`, and the `bos/eos/unk/pad` tokens with their ids (None when the
    checkpoint names no such token).
    """

    def __init__(self, backend: tokenizers.Tokenizer, special_tokens: dict[str, str]) -> None:
        self.backend = backend
        self.bos_token = special_tokens.get("bos_token")
        self.eos_token = special_tokens.get("eos_token")
        self.unk_token = special_tokens.get("unk_token")
        self.pad_token = special_tokens.get("pad_token")
        self.bos_token_id = self._id_of(self.bos_token)
        self.eos_token_id = self._id_of(self.eos_token)
        self.unk_token_id = self._id_of(self.unk_token)
        self.pad_token_id = self._id_of(self.pad_token)

    def _id_of(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: int | Iterable[int], skip_special_tokens: bool = False) -> str:
        """The text of `token_ids` (a list, a tensor row, or one id)."""
        ids = [token_ids] if isinstance(token_ids, int) else [int(i) for i in token_ids]
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | None | list[int | None]:
        """The id of each token string; an unknown one maps to `unk_token_id`."""
        if isinstance(tokens, str):
            return self._id_or_unk(tokens)
        return [self._id_or_unk(token) for token in tokens]

    def _id_or_unk(self, token: str) -> int | None:
        index = self.backend.token_to_id(token)
        return self.unk_token_id if index is None else index


def load_tokenizer(path: str | Path | None = None) -> Tokenizer | PreTrainedTokenizerBase:
    """The tokenizer saved next to the weights (the embedded model's when `path` is None).

    A `Tokenizer` over `tokenizer.json` when the folder has one that transformers would use
    as it is; otherwise transformers' `AutoTokenizer`, imported only then, whose methods of
    the same names behave the same.
    """
    folder = model_folder(path)
    config = read_tokenizer_config(folder)
    if (folder / TOKENIZER_FILE).is_file():
        backend = tokenizers.Tokenizer.from_file(str(folder / TOKENIZER_FILE))
        if reads_like_transformers(config, backend):
            return Tokenizer(backend, special_tokens(config))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def read_tokenizer_config(folder: Path) -> dict[str, Any]:
    """tokenizer_config.json, with special tokens it lacks taken from special_tokens_map.json."""
    config_file, map_file = folder / CONFIG_FILE, folder / SPECIAL_TOKENS_FILE
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    if map_file.is_file():
        for key, value in json.loads(map_file.read_text()).items():
            config.setdefault(key, value)
    return config


def special_tokens(config: dict[str, Any]) -> dict[str, str]:
    """The named special tokens of a tokenizer config, e.g. {"eos_token": "</s>"}."""
    found = {}
    for key in SPECIAL_TOKEN_KEYS:
        value = config.get(key)
        # A token is saved either as its text or as an AddedToken record with a "content".
        if isinstance(value, dict):
            value = value.get("content")
        if value:
            found[key] = value
    return found


def reads_like_transformers(config: dict[str, Any], backend: tokenizers.Tokenizer) -> bool:
    """Whether transformers would use `backend` unchanged, so that reading it gives its ids.

    It would not for a tokenizer class with defaults of its own (GPT2Tokenizer, say), a
    special token missing from the vocabulary (it adds one), or a clean-up of spaces on decode
    (it applies one to every tokenizer model but BPE).
    """
    if config.get("tokenizer_class") not in GENERIC_CLASSES:
        return False
    if any(backend.token_to_id(token) is None for token in special_tokens(config).values()):
        return False
    cleans_up = config.get("clean_up_tokenization_spaces", False)
    return not (cleans_up and type(backend.model).__name__ != "BPE")
