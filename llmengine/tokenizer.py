"""The checkpoint's own tokenizer, loaded offline from its folder."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from llmengine.loader import model_folder

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def load_tokenizer(path: str | Path | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer saved next to the weights (the embedded model's when `path` is None).

    Tokenization is not what this engine teaches, so it reuses transformers' tokenizers;
    transformers is imported here, not at package import, to keep `import llmengine` fast.
    """
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_folder(path)), local_files_only=True)
