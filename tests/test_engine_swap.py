"""Preemption by swap on real weights: the same text as recompute, and nothing recomputed."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import seed_tables as seeds
import torch
from engine_runs import prompts_for, run_recorded
from hf_llama import save_random_llama

import llmengine
from llmengine.engine import Engine
from llmengine.kv.paged_cache import PagedKVCache
from llmengine.outcome import IterationOutcome
from llmengine.sampling import SamplingParams
from llmengine.scheduling.request import RequestState

GREEDY = SamplingParams(max_tokens=20, ignore_eos=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("swap-llama")
    save_random_llama(folder, seed=3, vocab_size=97, num_hidden_layers=2)
    return folder


@pytest.fixture(scope="module")
def model(checkpoint: Path) -> llmengine.Llama:
    return llmengine.load_model(checkpoint)


@pytest.fixture(scope="module")
def embedded() -> llmengine.Llama:
    return llmengine.load_model()


def swap_totals(outcomes: list[IterationOutcome]) -> dict[str, int]:
    """What a run's outcomes say about its evictions, of both kinds, and the blocks moved."""
    swapped_out = sum(len(o.swapped_out) for o in outcomes)
    return {
        "evicted": sum(len(o.evicted) for o in outcomes),
        "swapped_out": swapped_out,
        "swapped_in": sum(len(o.swapped_in) for o in outcomes),
        "by_recompute": sum(len(o.evicted) for o in outcomes) - swapped_out,
        "recomputed": sum(o.recomputed_tokens for o in outcomes),
        "forward": sum(o.forward_tokens for o in outcomes),
        "blocks_out": sum(o.blocks_swapped_out for o in outcomes),
        "blocks_in": sum(o.blocks_swapped_in for o in outcomes),
    }


def test_swap_and_recompute_give_the_same_text_in_every_pool(model: llmengine.Llama) -> None:
    prompts = prompts_for(0, 6, model.config.vocab_size)
    roomy, _ = run_recorded(
        Engine(model, num_blocks=64, block_size=4, num_slots=6), prompts, GREEDY
    )
    for pool in (16, 12, 9):
        recompute, recompute_outcomes = run_recorded(
            Engine(model, num_blocks=pool, block_size=4, num_slots=6), prompts, GREEDY
        )
        swap, swap_outcomes = run_recorded(
            Engine(
                model, num_blocks=pool, block_size=4, num_slots=6, preemption="swap", swap_blocks=64
            ),
            prompts,
            GREEDY,
        )
        assert swap == recompute == roomy, f"pool of {pool} blocks"
        totals = swap_totals(swap_outcomes)
        assert totals["swapped_out"] == totals["evicted"] > 0
        assert totals["swapped_in"] == totals["swapped_out"]
        assert totals["recomputed"] == 0 < swap_totals(recompute_outcomes)["recomputed"]


def test_seeded_sampling_is_the_same_under_swap(model: llmengine.Llama) -> None:
    prompts = prompts_for(2, 5, model.config.vocab_size)
    params = [
        SamplingParams(max_tokens=16, temperature=0.9, top_k=20, seed=s, ignore_eos=True)
        for s in range(5)
    ]
    roomy = Engine(model, num_blocks=64, block_size=4, num_slots=5).generate(prompts, params)
    swap = Engine(model, num_blocks=8, block_size=4, num_slots=5, preemption="swap", swap_blocks=16)
    outputs, outcomes = run_recorded(swap, prompts, params)
    assert outputs == roomy and swap_totals(outcomes)["swapped_out"] > 0


def test_a_swapped_request_recomputes_nothing(model: llmengine.Llama) -> None:
    prompts = prompts_for(4, 6, model.config.vocab_size, low=5, high=9)
    engine = Engine(
        model, num_blocks=10, block_size=4, num_slots=6, preemption="swap", swap_blocks=64
    )
    _, outcomes = run_recorded(engine, prompts, GREEDY)
    for outcome in outcomes:
        for request_id in outcome.swapped_in:
            # Back as a decode: one position, not a prefill, nothing counted as recomputed.
            assert outcome.row_positions[request_id] == 1
            assert request_id not in outcome.admitted and request_id not in outcome.resumed
        assert outcome.blocks_swapped_out >= len(outcome.swapped_out)
    totals = swap_totals(outcomes)
    assert totals["swapped_out"] > 0 and totals["recomputed"] == 0
    # Every prompt position once, every generated token but the last once: nothing twice.
    assert totals["forward"] == sum(len(p) + GREEDY.max_tokens - 1 for p in prompts)
    assert totals["blocks_in"] == totals["blocks_out"]


def test_a_full_swap_space_falls_back_to_recompute_with_the_same_text(
    model: llmengine.Llama,
) -> None:
    prompts = prompts_for(5, 6, model.config.vocab_size)
    roomy, _ = run_recorded(
        Engine(model, num_blocks=64, block_size=4, num_slots=6), prompts, GREEDY
    )
    engine = Engine(
        model, num_blocks=9, block_size=4, num_slots=6, preemption="swap", swap_blocks=4
    )
    outputs, outcomes = run_recorded(engine, prompts, GREEDY)
    totals = swap_totals(outcomes)
    assert outputs == roomy
    assert totals["swapped_out"] > 0 and totals["by_recompute"] > 0
    # The fallbacks come back as resumed prefills, recomputing; the swapped ones do not.
    resumed = [request_id for o in outcomes for request_id in o.resumed]
    assert len(resumed) == totals["by_recompute"] and totals["recomputed"] > 0
    assert max(o.held_swap_blocks for o in outcomes) <= engine.num_swap_blocks == 4


def test_swapped_requests_return_in_the_order_they_left_before_anyone_waiting(
    model: llmengine.Llama,
) -> None:
    prompts = prompts_for(6, 12, model.config.vocab_size, low=4, high=10)
    engine = Engine(
        model, num_blocks=12, block_size=4, num_slots=4, preemption="swap", swap_blocks=64
    )
    _, outcomes = run_recorded(engine, prompts, GREEDY)
    left: list[int] = []
    returned: list[int] = []
    admissions = 0
    for outcome in outcomes:
        left += outcome.swapped_out
        returned += outcome.swapped_in
        if outcome.admitted:
            admissions += len(outcome.admitted)
            assert returned == left, "admitted a request while an earlier one was in swap"
        assert returned == left[: len(returned)], "swapped requests came back out of order"
    assert len(left) >= 3 and admissions == len(prompts)


def test_abort_of_a_swapped_request_frees_host_and_device_blocks(model: llmengine.Llama) -> None:
    engine = Engine(
        model, num_blocks=6, block_size=4, num_slots=3, preemption="swap", swap_blocks=8
    )
    prompts = prompts_for(7, 3, model.config.vocab_size, low=8, high=8)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    while not engine.step().swapped_out:
        engine.check_integrity()
    (victim,) = [i for i in ids if engine.request(i).state == RequestState.SWAPPED]
    assert engine.num_free_swap_blocks < engine.num_swap_blocks
    assert engine.abort(victim) is True
    engine.check_integrity()
    assert engine.request(victim).state == RequestState.ABORTED
    assert engine.num_free_swap_blocks == engine.num_swap_blocks
    with pytest.raises(ValueError, match="already aborted"):
        engine.abort(victim)
    while engine.has_unfinished():
        assert victim not in engine.step().tokens
        engine.check_integrity()
    assert engine.num_free_blocks == engine.num_blocks
    assert all(len(engine.request(i).output_token_ids) == 8 for i in ids if i != victim)


def test_stress_under_swap_with_a_swap_space_too_small(model: llmengine.Llama) -> None:
    for seed in (21, 22):
        rng = random.Random(seed)
        prompts = prompts_for(seed, 24, model.config.vocab_size, low=1, high=20)
        params = [SamplingParams(max_tokens=rng.randint(1, 24), ignore_eos=True) for _ in prompts]
        roomy = Engine(model, num_blocks=256, block_size=4, num_slots=24).generate(prompts, params)
        cramped = Engine(
            model, num_blocks=12, block_size=4, num_slots=6, preemption="swap", swap_blocks=6
        )
        outputs, outcomes = run_recorded(cramped, prompts, params)
        totals = swap_totals(outcomes)
        assert totals["evicted"] > 10
        assert totals["swapped_out"] > 0 and totals["by_recompute"] > 0
        assert outputs == roomy


def test_embedded_model_day34_burst_under_swap(embedded: llmengine.Llama) -> None:
    """The Day-34 burst at 12 blocks: the recompute bill of the seed, and swap's zero."""
    prompts = prompts_for(34, seeds.DAY34_REQUESTS, embedded.config.vocab_size, 5, 5)
    params = SamplingParams(max_tokens=seeds.DAY34_BUDGET, ignore_eos=True)

    def run(**kwargs: object) -> tuple[list[list[int]], dict[str, int]]:
        engine = Engine(
            embedded,
            num_blocks=12,
            block_size=seeds.DAY34_BLOCK,
            num_slots=seeds.DAY34_SLOTS,
            **kwargs,
        )
        outputs, outcomes = run_recorded(engine, prompts, params)
        return outputs, swap_totals(outcomes)

    recompute, recompute_totals = run()
    swap, swap_totals_ = run(preemption="swap", swap_blocks=64)
    assert swap == recompute
    assert recompute_totals["forward"] == seeds.DAY34_FORWARD_POSITIONS[12]
    once = seeds.DAY34_REQUESTS * (seeds.DAY34_PROMPT + seeds.DAY34_BUDGET - 1)
    assert swap_totals_["forward"] == once and swap_totals_["recomputed"] == 0
    assert swap_totals_["swapped_out"] == swap_totals_["evicted"] > 0


def test_embedded_model_text_is_the_same_under_swap_and_recompute(
    embedded: llmengine.Llama,
) -> None:
    tokenizer = llmengine.load_tokenizer()
    prompts = ["ROMEO:\n", "JULIET:\nO", "HAMLET:\nTo be", "KING:\nWhat"]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    texts = []
    for pool, swap_blocks in ((64, 0), (10, 0), (10, 64), (10, 3)):
        engine = Engine(
            embedded,
            num_blocks=pool,
            block_size=4,
            num_slots=4,
            preemption="swap" if swap_blocks else "recompute",
            swap_blocks=swap_blocks,
            tokenizer=tokenizer,
        )
        encoded = [tokenizer.encode(prompt) for prompt in prompts]
        outputs, outcomes = run_recorded(engine, encoded, params)
        if swap_blocks:
            assert swap_totals(outcomes)["swapped_out"] > 0
        texts.append([tokenizer.decode(tokens, skip_special_tokens=True) for tokens in outputs])
    assert all(text == texts[0] for text in texts)


def test_swap_with_no_swap_blocks_steps_exactly_as_recompute(model: llmengine.Llama) -> None:
    prompts = prompts_for(8, 6, model.config.vocab_size)
    recompute, recompute_outcomes = run_recorded(
        Engine(model, num_blocks=9, block_size=4, num_slots=6), prompts, GREEDY
    )
    swap, swap_outcomes = run_recorded(
        Engine(model, num_blocks=9, block_size=4, num_slots=6, preemption="swap"), prompts, GREEDY
    )
    assert swap == recompute and swap_outcomes == recompute_outcomes
    assert swap_totals(swap_outcomes)["evicted"] > 0


def test_the_cache_copies_blocks_out_and_back_bit_for_bit(model: llmengine.Llama) -> None:
    config = model.config
    cache = PagedKVCache(config, num_blocks=6, block_size=4, swap_blocks=3)
    generator = torch.Generator().manual_seed(0)
    for layer in (*cache.keys, *cache.values):
        layer.copy_(torch.randn(layer.shape, generator=generator))
    before = [layer.clone() for layer in (*cache.keys, *cache.values)]
    cache.swap_out([(4, 0), (1, 2)])
    cache.swap_in([(2, 5), (0, 3)])
    for original, layer in zip(before, (*cache.keys, *cache.values), strict=True):
        assert torch.equal(layer[5], original[1]) and torch.equal(layer[3], original[4])
        assert torch.equal(layer[[0, 1, 2, 4]], original[[0, 1, 2, 4]])
    element = cache.keys[0].element_size()
    expected = 2 * config.num_hidden_layers * 4 * config.num_key_value_heads * config.head_dim
    assert cache.bytes_per_block == expected * element


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_swap_space_is_pinned_and_swap_gives_the_same_text(checkpoint: Path) -> None:
    cuda_model = llmengine.load_model(checkpoint, device="cuda")
    engine = Engine(
        cuda_model, num_blocks=9, block_size=4, num_slots=6, preemption="swap", swap_blocks=64
    )
    host = engine.runner.cache.host_keys + engine.runner.cache.host_values
    assert all(tensor.device.type == "cpu" and tensor.is_pinned() for tensor in host)
    prompts = prompts_for(0, 6, cuda_model.config.vocab_size)
    outputs, outcomes = run_recorded(engine, prompts, GREEDY)
    assert swap_totals(outcomes)["swapped_out"] > 0
    roomy = Engine(cuda_model, num_blocks=64, block_size=4, num_slots=6)
    assert outputs == roomy.generate(prompts, GREEDY)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"preemption": "evict"}, "preemption must be one of"),
        ({"preemption": "swap", "swap_blocks": -4}, "swap_blocks must be a whole number"),
        ({"swap_blocks": 8}, "needs preemption='swap'"),
    ],
)
def test_bad_preemption_settings_are_refused(
    model: llmengine.Llama, kwargs: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Engine(model, num_blocks=8, block_size=4, **kwargs)
