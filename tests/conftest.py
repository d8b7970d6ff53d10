"""Fixtures many test files share: the embedded model and its tokenizer, one per module."""

from __future__ import annotations

from typing import Any

import pytest

import llmengine


@pytest.fixture(scope="module")
def model() -> llmengine.Llama:
    """The embedded model; module-scoped, as each file loaded its own before."""
    return llmengine.load_model()


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """The embedded model's tokenizer."""
    return llmengine.load_tokenizer()
