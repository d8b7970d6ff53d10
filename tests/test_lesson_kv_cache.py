"""Lessons 05-08 and the cache benchmark: the numbers they print, recomputed independently.

05 counts positions per forward and compares cached with uncached tokens; 06 measures what a
contiguous cache reserves against what it fills; 07 walks sequences through a paged cache;
08 measures the unfilled tails of last blocks. Each test recomputes the lesson's number by
arithmetic or from the cache's memory, not through the helper that the lesson calls.
"""

from __future__ import annotations

import random

import pytest
import torch

from llmengine.bench.decode_step import prepare_decode_steps, random_llama, time_decode_step
from llmengine.generation import generate_tokens
from llmengine.kv.blocks import BlockTable, blocks_for_length
from llmengine.kv.contiguous_cache import ContiguousKVCache, contiguous_forward
from llmengine.kv.paged_cache import PagedKVCache
from llmengine.lessons.cached_generation import generate_greedy_contiguous
from llmengine.lessons.forward_log import ForwardLog
from llmengine.lessons.fragmentation import kv_bytes_per_position, measure_tail_waste
from llmengine.lessons.paged_walkthrough import PagedWalkthrough
from llmengine.model.config import LlamaConfig
from llmengine.model.llama import Llama
from llmengine.runner.attention import flat_indices
from llmengine.sampling import SamplingParams

TINY = LlamaConfig(
    vocab_size=53,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=256,
)


@pytest.fixture(scope="module")
def model() -> Llama:
    # Large weights make greedy continuations vary, so equal tokens mean something.
    return random_llama(TINY, seed=1, std=0.3)


def prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(TINY.vocab_size) for _ in range(length)]


# -- 05: why a KV cache ------------------------------------------------------------------


def test_05_positions_grow_quadratically_without_a_cache(model: Llama) -> None:
    length, steps = 5, 12
    params = SamplingParams(max_tokens=steps, ignore_eos=True)
    with ForwardLog(model) as plain:
        generate_tokens(model, prompt(length, 0), params)
    with ForwardLog(model) as cached:
        generate_greedy_contiguous(model, [prompt(length, 0)], steps)
    assert plain.positions == [length + step for step in range(steps)]
    assert cached.positions == [length] + [1] * (steps - 1)
    assert plain.cumulative_positions[-1] == steps * length + steps * (steps - 1) // 2
    assert cached.cumulative_positions[-1] == length + steps - 1
    assert len(plain.seconds_per_forward) == steps
    assert all(seconds > 0 for seconds in plain.seconds_per_forward)


def test_05_cached_and_uncached_generate_the_same_tokens(model: Llama) -> None:
    prompts = [prompt(n, seed) for seed, n in enumerate((3, 9, 1, 6))]
    budgets = [20, 7, 15, 1]
    cached, _ = generate_greedy_contiguous(model, prompts, budgets)
    for tokens, row_prompt, budget in zip(cached, prompts, budgets, strict=True):
        plain = generate_tokens(
            model, row_prompt, SamplingParams(max_tokens=budget, ignore_eos=True)
        )
        assert tokens == plain
    assert len(set(cached[0])) > 3  # the weights give varied text, so equality is not trivial


def test_05_forward_log_needs_the_block_to_end(model: Llama) -> None:
    log = ForwardLog(model)
    with pytest.raises(RuntimeError, match="still recording"):
        _ = log.seconds_per_forward


# -- 06: the contiguous cache ---------------------------------------------------------------


def test_06_filled_positions_are_what_the_memory_holds(model: Llama) -> None:
    prompts = [prompt(n, seed) for seed, n in enumerate((4, 17, 9))]
    budgets = [6, 2, 11]
    _, cache = generate_greedy_contiguous(model, prompts, budgets, max_seq_len=64)
    expected = [len(p) + b - 1 for p, b in zip(prompts, budgets, strict=True)]
    assert cache.lengths == expected
    written = (cache.keys[0].abs().sum(dim=(2, 3)) != 0).sum(dim=1).tolist()
    assert written == expected
    assert cache.keys[0].shape[:2] == (3, 64)


def test_06_default_reservation_is_the_longest_need(model: Llama) -> None:
    _, cache = generate_greedy_contiguous(model, [prompt(4, 0), prompt(10, 1)], [9, 2])
    assert cache.max_seq_len == max(4 + 9 - 1, 10 + 2 - 1)


def test_06_bytes_per_position_match_the_tensors() -> None:
    cache = PagedKVCache(TINY, num_blocks=5, block_size=4)
    total = sum(t.numel() * t.element_size() for t in cache.keys + cache.values)
    assert kv_bytes_per_position(TINY) == total // (5 * 4)
    assert kv_bytes_per_position(TINY, torch.bfloat16) * 2 == kv_bytes_per_position(TINY)


# -- 07: the paged cache -----------------------------------------------------------------


def walkthrough(model: Llama) -> tuple[PagedWalkthrough, list[int]]:
    """The lesson's story in small: three sequences grow, one finishes, a newcomer reuses.

    Returns the walk and the blocks B gave back.
    """
    walk = PagedWalkthrough(model, num_blocks=12, block_size=4)
    for name, length in (("A", 5), ("B", 9), ("C", 3)):
        walk.add(name, prompt(length, seed=length))
    walk.decode(6)
    freed = walk.finish("B")
    walk.add("D", prompt(7, seed=7))
    walk.decode(3)
    return walk, freed


def test_07_paged_forward_equals_uncached_and_reuses_freed_blocks(model: Llama) -> None:
    walk, freed_by_b = walkthrough(model)
    assert walk.max_abs_error < 1e-4
    assert walk.forwards == 3 + 6 + 1 + 3
    assert walk.rows_checked == 3 + 6 * 3 + 1 + 3 * 3
    assert set(walk.tables["D"].block_ids) & set(freed_by_b)
    for snapshot in walk.snapshots:
        held = [block for table in snapshot.tables.values() for block in table]
        assert len(held) == len(set(held))  # no block has two owners
        for name, table in snapshot.tables.items():
            assert len(table) == blocks_for_length(snapshot.lengths[name], walk.block_size)
    walk.pool.check_integrity()
    assert walk.pool.num_held == sum(len(t.block_ids) for t in walk.tables.values())
    final = walk.snapshots[-1]
    # A 5-token prompt, its first token, then 6 + 3 decodes: 5 + 9 positions cached.
    assert final.lengths["A"] == 5 + 6 + 3
    assert final.lengths["D"] == 7 + 3


def test_07_flat_index_of_a_position_holds_that_positions_keys(model: Llama) -> None:
    walk, _ = walkthrough(model)
    table, tokens = walk.tables["D"], walk.tokens["D"]
    reference = ContiguousKVCache(TINY, max_batch=1, max_seq_len=len(tokens))
    with torch.no_grad():
        contiguous_forward(model, reference, torch.tensor([tokens[: table.num_tokens]]))
    positions = torch.arange(table.num_tokens)
    indices = flat_indices(torch.tensor([table.block_ids]), positions[None], walk.block_size)[0]
    for position in range(table.num_tokens):
        block, offset = table.location_of(position)
        index = block * walk.block_size + offset
        assert index == int(indices[position])
        for layer in range(TINY.num_hidden_layers):
            stored = walk.cache.keys[layer].flatten(0, 1)[index]
            assert torch.allclose(stored, reference.keys[layer][0, position], atol=1e-5)


def test_07_plots_draw_the_run(model: Llama) -> None:
    import matplotlib

    matplotlib.use("Agg", force=True)
    from llmengine.lessons.paged_walkthrough import plot_pool_history, plot_tables_and_pool

    walk, _ = walkthrough(model)
    figures = [plot_tables_and_pool(walk), plot_pool_history(walk)]
    assert [len(fig.axes) for fig in figures] == [2, 1]


# -- 08: fragmentation -------------------------------------------------------------------

LESSON_08_LENGTHS = [random.Random(3).randint(1, 300) for _ in range(200)]


@pytest.mark.parametrize("block_size", [1, 2, 4, 8, 16, 32, 64])
def test_08_tail_waste_is_the_rounding_and_stays_under_the_bound(block_size: int) -> None:
    waste = measure_tail_waste(LESSON_08_LENGTHS, block_size)
    tails = [(-length) % block_size for length in LESSON_08_LENGTHS]
    assert waste.tokens == sum(LESSON_08_LENGTHS)
    assert waste.blocks == sum(-(-length // block_size) for length in LESSON_08_LENGTHS)
    assert waste.empty_positions == sum(tails) == waste.reserved_positions - waste.tokens
    assert waste.max_tail == max(tails) <= block_size - 1
    assert waste.empty_positions <= waste.bound == (block_size - 1) * len(LESSON_08_LENGTHS)
    assert waste.waste_fraction == pytest.approx(sum(tails) / (waste.blocks * block_size))


def test_08_block_size_one_wastes_nothing_and_one_table_grows_like_the_scheduler() -> None:
    assert measure_tail_waste([7, 1, 30], 1).empty_positions == 0
    table = BlockTable(4)
    with pytest.raises(ValueError, match="extend it first"):
        table.append()
    assert measure_tail_waste([4, 5], 4).blocks == 1 + 2


def test_08_rejects_empty_sequences() -> None:
    with pytest.raises(ValueError, match="length >= 1"):
        measure_tail_waste([3, 0], 4)


# -- the benchmark -----------------------------------------------------------------------


@pytest.mark.parametrize(("batch", "context", "block_size"), [(3, 9, 4), (2, 16, 16), (1, 1, 2)])
def test_bench_paged_and_contiguous_steps_compute_the_same_logits(
    batch: int, context: int, block_size: int
) -> None:
    bench_model = random_llama(TINY, seed=2)
    steps = prepare_decode_steps(bench_model, batch, context, block_size)
    with torch.inference_mode():
        first = steps.contiguous()
        again = steps.contiguous()  # the step rewinds the cache, so it repeats exactly
        paged = steps.paged()
    assert first.shape == (batch, TINY.vocab_size)
    assert torch.equal(first, again)
    assert (first - paged).abs().max().item() < 1e-5


def test_bench_timing_reports_both_medians() -> None:
    timing = time_decode_step(random_llama(TINY), batch=2, context=8, repeats=3, warmup=1)
    assert timing.contiguous_s > 0 and timing.paged_s > 0
    assert timing.ratio == timing.paged_s / timing.contiguous_s
