"""Sampling: each knob, seeded reproducibility, validation and the stop rule."""

import dataclasses

import pytest
import torch

import llmengine
from llmengine.sampling import (
    SamplingParams,
    candidate_distribution,
    draw_one,
    finish_reason,
    make_generator,
    sample_tokens,
)

VOCAB = 50


def random_logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def draw(logits: torch.Tensor, params: SamplingParams) -> int:
    return sample_tokens(logits.unsqueeze(0), [params], [make_generator(params)])[0]


def test_exported_from_package() -> None:
    assert llmengine.SamplingParams is SamplingParams


def test_defaults_are_greedy_and_frozen() -> None:
    params = SamplingParams()
    assert (params.max_tokens, params.temperature, params.top_k, params.top_p) == (16, 0.0, 0, 1.0)
    assert params.seed is None and params.stop_token_ids == () and not params.ignore_eos
    assert params.greedy
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.temperature = 1.0  # type: ignore[misc]


def test_stop_token_ids_become_a_tuple() -> None:
    params = SamplingParams(stop_token_ids=[3, 4])  # type: ignore[arg-type]
    assert params.stop_token_ids == (3, 4)
    assert hash(params) == hash(SamplingParams(stop_token_ids=(3, 4)))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": 1e-38}, "temperature"),
        ({"temperature": 1e39}, "float32's largest"),
        ({"repetition_penalty": 1e-300}, "repetition_penalty"),
        ({"repetition_penalty": 1e300}, "repetition_penalty"),
        ({"top_k": -1}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"seed": -1}, "seed"),
        ({"stop_token_ids": (1, -2)}, "stop_token_ids"),
    ],
)
def test_invalid_values_raise_a_clear_error(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_the_largest_temperature_keeps_a_masked_token_masked() -> None:
    """At the largest temperature a float32 holds, every allowed token is equally likely and
    a masked one (-inf) stays impossible: the arithmetic is honoured, so it is accepted."""
    logits = torch.tensor([3.0, float("-inf"), -2.0, float("-inf")])
    tokens, probs = candidate_distribution(logits, SamplingParams(temperature=3.4e38))
    assert sorted(tokens.tolist()) == [0, 1, 2, 3]
    by_token = dict(zip(tokens.tolist(), probs.tolist(), strict=True))
    assert by_token[1] == by_token[3] == 0.0 and by_token[0] == by_token[2] == 0.5


def test_greedy_is_the_argmax_of_every_row() -> None:
    logits = random_logits(4)
    params = [SamplingParams()] * 4
    assert sample_tokens(logits, params, [None] * 4) == logits.argmax(dim=-1).tolist()


def test_greedy_ties_pick_the_lowest_id_like_top_k_one() -> None:
    logits = torch.zeros(VOCAB)
    logits[[7, 9]] = 5.0
    assert draw(logits, SamplingParams()) == 7
    assert draw(logits, SamplingParams(temperature=1.0, top_k=1, seed=3)) == 7


@pytest.mark.parametrize("seed", range(5))
def test_top_k_one_and_tiny_top_p_equal_greedy(seed: int) -> None:
    logits = random_logits(1, seed)[0]
    greedy = int(logits.argmax())
    assert draw(logits, SamplingParams(temperature=2.0, top_k=1, seed=seed)) == greedy
    assert draw(logits, SamplingParams(temperature=2.0, top_p=1e-6, seed=seed)) == greedy


def test_top_k_only_draws_from_the_k_best() -> None:
    logits = random_logits(1, 1)[0]
    best = set(torch.topk(logits, 3).indices.tolist())
    generator = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=5.0, top_k=3)
    drawn = {sample_tokens(logits[None], [params], [generator])[0] for _ in range(300)}
    assert drawn == best


def test_top_p_keeps_the_smallest_set_reaching_the_mass() -> None:
    # probabilities 0.5, 0.3, 0.2: top_p=0.7 needs the first two, 0.5 only the first
    logits = torch.log(torch.tensor([0.2, 0.5, 0.3]))
    generator = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=1.0, top_p=0.7)
    drawn = {sample_tokens(logits[None], [params], [generator])[0] for _ in range(300)}
    assert drawn == {1, 2}
    assert draw(logits, SamplingParams(temperature=1.0, top_p=0.5, seed=1)) == 1


def test_draws_follow_the_softmax_distribution() -> None:
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    logits = torch.log(probs)
    generator = torch.Generator().manual_seed(1234)
    params = SamplingParams(temperature=1.0)
    draws = 4000
    counts = torch.zeros(4)
    for _ in range(draws):
        counts[sample_tokens(logits[None], [params], [generator])[0]] += 1
    # four standard deviations of a binomial count at p=0.5 is about 0.032 of the draws
    assert torch.allclose(counts / draws, probs, atol=0.03)


def test_temperature_sharpens_and_flattens() -> None:
    logits = torch.log(torch.tensor([0.6, 0.4]))
    generator = torch.Generator().manual_seed(7)

    def share_of_best(temperature: float) -> float:
        params = SamplingParams(temperature=temperature)
        picks = [sample_tokens(logits[None], [params], [generator])[0] for _ in range(2000)]
        return picks.count(0) / len(picks)

    assert share_of_best(0.1) > 0.95
    assert 0.45 < share_of_best(100.0) < 0.55


def test_a_seed_reproduces_its_tokens_whatever_the_batch() -> None:
    logits = random_logits(3, 5)
    seeded = SamplingParams(temperature=1.0, seed=42)

    def stream(batch: list[SamplingParams], rows: torch.Tensor, row: int) -> list[int]:
        generators = [make_generator(params) for params in batch]
        return [sample_tokens(rows, batch, generators)[row] for _ in range(20)]

    alone = stream([seeded], logits[1:2], 0)
    assert len(set(alone)) > 1
    neighbours = [
        [SamplingParams(), seeded, SamplingParams(temperature=0.7)],
        [SamplingParams(temperature=1.5, seed=9), seeded, SamplingParams(temperature=1.0, top_k=5)],
    ]
    for batch in neighbours:
        assert stream(batch, logits, 1) == alone


def test_different_seeds_give_different_streams() -> None:
    logits = torch.zeros(1, VOCAB)

    def stream(seed: int) -> list[int]:
        params = SamplingParams(temperature=1.0, seed=seed)
        generator = make_generator(params)
        return [sample_tokens(logits, [params], [generator])[0] for _ in range(20)]

    assert stream(1) == stream(1)
    assert stream(1) != stream(2)


def test_make_generator_is_none_without_a_seed() -> None:
    assert make_generator(SamplingParams(temperature=1.0)) is None
    assert isinstance(make_generator(SamplingParams(seed=0)), torch.Generator)


def test_sample_tokens_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="rows"):
        sample_tokens(random_logits(2), [SamplingParams()], [None])
    with pytest.raises(ValueError, match="vocab"):
        sample_tokens(torch.zeros(VOCAB), [SamplingParams()], [None])


@pytest.mark.parametrize(
    ("params", "num_generated", "token", "expected"),
    [
        (SamplingParams(max_tokens=3), 1, 5, None),
        (SamplingParams(max_tokens=3), 3, 5, "length"),
        (SamplingParams(max_tokens=3), 3, 2, "length"),
        (SamplingParams(max_tokens=3, stop_token_ids=(5,)), 1, 5, "stop"),
        (SamplingParams(max_tokens=3), 1, 2, "eos"),
        (SamplingParams(max_tokens=3), 1, 9, "eos"),
        (SamplingParams(max_tokens=3, ignore_eos=True), 1, 2, None),
        (SamplingParams(max_tokens=3, ignore_eos=True, stop_token_ids=(2,)), 1, 2, "stop"),
    ],
)
def test_finish_reason(
    params: SamplingParams, num_generated: int, token: int, expected: str | None
) -> None:
    assert finish_reason(params, num_generated, token, eos_token_ids=(2, 9)) == expected


def test_candidate_distribution_applies_each_knob_in_order() -> None:
    # probabilities 0.5, 0.3, 0.15, 0.05 (in vocabulary order 1, 2, 0, 3)
    probs = torch.tensor([0.15, 0.5, 0.3, 0.05])
    logits = torch.log(probs)
    tokens, kept = candidate_distribution(logits, SamplingParams(temperature=1.0))
    assert tokens.tolist() == [1, 2, 0, 3]
    assert torch.allclose(kept, probs[tokens])
    tokens, kept = candidate_distribution(logits, SamplingParams(temperature=1.0, top_k=2))
    assert tokens.tolist() == [1, 2] and torch.allclose(kept, torch.tensor([0.625, 0.375]))
    tokens, kept = candidate_distribution(logits, SamplingParams(temperature=1.0, top_p=0.9))
    assert tokens.tolist() == [1, 2, 0] and torch.allclose(kept, probs[[1, 2, 0]] / 0.95)
    tokens, hot = candidate_distribution(logits, SamplingParams(temperature=2.0))
    assert torch.allclose(hot, probs[tokens].sqrt() / probs.sqrt().sum())


def test_candidate_distribution_of_greedy_is_the_argmax() -> None:
    logits = random_logits(1, 3)[0]
    tokens, kept = candidate_distribution(logits, SamplingParams())
    assert tokens.tolist() == [int(logits.argmax())] and kept.tolist() == [1.0]


def test_draw_one_draws_what_multinomial_draws_and_moves_the_generator_as_far() -> None:
    """Seeded texts stay as they were: the same index, and the next draw the same too."""
    lengths = torch.Generator().manual_seed(1)
    for seed in range(200):
        size = int(torch.randint(1, 200, (1,), generator=lengths))
        probs = torch.softmax(torch.randn(size, generator=lengths) * 3, dim=-1)
        ours, theirs = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        for _ in range(3):
            assert (
                draw_one(probs, ours).tolist()
                == torch.multinomial(probs, 1, generator=theirs).tolist()
            )
