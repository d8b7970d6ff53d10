"""The plain generation loop: its stopping, its cost, and agreement with transformers."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from hf_llama import hf_greedy, save_random_llama

import llmengine
from llmengine.generation import generate_text, generate_tokens
from llmengine.params import check_prompt
from llmengine.sampling import SamplingParams


class SuccessorModel(torch.nn.Module):
    """A stand-in model whose greedy next token is always (last token + 1) mod vocab.

    It records the length of every forward, so tests can see what each step recomputed.
    """

    def __init__(self, vocab_size: int = 10, eos_token_ids: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.config = SimpleNamespace(vocab_size=vocab_size, eos_token_ids=eos_token_ids)
        self.scale = torch.nn.Parameter(torch.tensor(10.0))
        self.forward_lengths: list[int] = []

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.forward_lengths.append(input_ids.shape[1])
        successor = (input_ids + 1) % self.config.vocab_size
        return F.one_hot(successor, self.config.vocab_size).float() * self.scale


def test_exported_from_package() -> None:
    assert llmengine.generate_tokens is generate_tokens


def test_greedy_runs_to_the_budget_recomputing_everything() -> None:
    model = SuccessorModel()
    assert generate_tokens(model, [2, 3], SamplingParams(max_tokens=4)) == [4, 5, 6, 7]
    assert model.forward_lengths == [2, 3, 4, 5]


def test_stops_on_eos_and_keeps_it() -> None:
    model = SuccessorModel(eos_token_ids=(6,))
    assert generate_tokens(model, [3], SamplingParams(max_tokens=10)) == [4, 5, 6]
    ignoring = SamplingParams(max_tokens=5, ignore_eos=True)
    assert generate_tokens(model, [3], ignoring) == [4, 5, 6, 7, 8]


def test_explicit_eos_ids_override_the_config() -> None:
    model = SuccessorModel(eos_token_ids=(6,))
    assert generate_tokens(model, [3], SamplingParams(max_tokens=10), eos_token_ids=(5,)) == [4, 5]


def test_stops_on_a_stop_token() -> None:
    model = SuccessorModel()
    params = SamplingParams(max_tokens=10, stop_token_ids=(7,))
    assert generate_tokens(model, [1], params) == [2, 3, 4, 5, 6, 7]


@pytest.mark.parametrize(("prompt", "message"), [([], "empty"), ([1, 10], "vocabulary")])
def test_bad_prompts_raise(prompt: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        generate_tokens(SuccessorModel(), prompt)


def test_check_prompt_returns_ints_and_names_what_is_wrong() -> None:
    assert check_prompt((torch.tensor(3), 0, 9), 10) == [3, 0, 9]
    assert all(type(token) is int for token in check_prompt(torch.tensor([1, 2]), 10))
    with pytest.raises(ValueError) as empty:
        check_prompt([], 10)
    assert str(empty.value) == "the prompt is empty: a request needs at least one token"
    with pytest.raises(ValueError) as outside:
        check_prompt([10, 1, -1, 11, 12, 13, 14], 10)
    assert str(outside.value) == "token ids outside the vocabulary [0, 10): [10, -1, 11, 12, 13]"


def test_seeded_sampling_is_reproducible() -> None:
    model = SuccessorModel()
    model.scale.data.fill_(0.5)  # flat enough that sampling wanders
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=11)
    first = generate_tokens(model, [0], params)
    assert first == generate_tokens(model, [0], params)
    assert first != generate_tokens(model, [0], SamplingParams(max_tokens=12))


def test_matches_transformers_greedy_generate(tmp_path: Path) -> None:
    reference = save_random_llama(tmp_path)
    prompt = [1, 17, 33, 5, 40]
    [expected] = hf_greedy(reference, torch.tensor([prompt]), steps=10)
    model = llmengine.load_model(tmp_path)
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    assert generate_tokens(model, prompt, params) == expected


def test_generate_text_with_the_embedded_model() -> None:
    model = llmengine.load_model()
    tokenizer = llmengine.load_tokenizer()
    params = SamplingParams(max_tokens=8)
    text = generate_text(model, tokenizer, "ROMEO:", params)
    assert isinstance(text, str) and text
    assert text == generate_text(model, tokenizer, "ROMEO:", params)
    sampled = SamplingParams(max_tokens=8, temperature=0.8, seed=3)
    assert generate_text(model, tokenizer, "ROMEO:", sampled) == generate_text(
        model, tokenizer, "ROMEO:", sampled
    )
