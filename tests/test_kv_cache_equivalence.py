"""No cache, the contiguous cache and the paged cache compute the same logits (1e-4, float32).

The paged runs mix prefill, chunked prefill and decode rows in one forward, use shuffled
block ids, block sizes 1, 4 and 16, and lengths that cross block boundaries or exactly fill
their last block. A freed block handed to another sequence must not leak its old K/V.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from llmengine.bench.decode_step import random_llama
from llmengine.kv.blocks import BlockPool, blocks_for_length
from llmengine.kv.contiguous_cache import ContiguousKVCache, contiguous_forward
from llmengine.kv.paged_cache import PagedKVCache
from llmengine.model.config import Llama3RopeScaling, LlamaConfig
from llmengine.model.llama import Llama, causal_mask, grouped_query_attention
from llmengine.runner.attention import GatheredAttention, PagedRow, flat_indices
from llmengine.runner.forward import paged_forward

VOCAB = 61


def random_model(num_kv_heads: int = 2, seed: int = 0) -> Llama:
    """A small seeded Llama with weights large enough that a wrong K/V changes the logits."""
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=num_kv_heads,
        head_dim=8,
        max_position_embeddings=256,
        rope_theta=500000.0,
        rope_scaling=Llama3RopeScaling(8.0, 1.0, 4.0, 16),
    )
    return random_llama(config, seed=seed, std=0.3)


def random_tokens(length: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (length,), generator=generator).tolist()


def reference_last_logits(model: Llama, tokens: list[int]) -> torch.Tensor:
    """No cache: the whole sequence again, logits at its last position."""
    return model(torch.tensor([tokens]))[0, -1]


def shuffled_pool(num_blocks: int, seed: int) -> BlockPool:
    """A pool whose free list is in random order, so tables get non-contiguous block ids."""
    pool = BlockPool(num_blocks)
    ids = pool.allocate(num_blocks)
    order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))
    pool.free([ids[i] for i in order])
    return pool


@dataclass
class Sequence:
    """A test sequence: its tokens so far, how many are cached, and its block table."""

    tokens: list[int]
    cached: int = 0
    blocks: list[int] = field(default_factory=list)


def paged_step(
    model: Llama, cache: PagedKVCache, pool: BlockPool, plan: list[tuple[Sequence, int | None]]
) -> None:
    """One paged forward over `plan` (sequence, new positions; None = all uncached).

    Checks every row's logits against no cache, then appends the greedy token to each row
    that consumed all its pending tokens, so the next step decodes it.
    """
    rows = []
    for sequence, count in plan:
        count = len(sequence.tokens) - sequence.cached if count is None else count
        end = sequence.cached + count
        sequence.blocks += pool.allocate(
            blocks_for_length(end, cache.block_size) - len(sequence.blocks)
        )
        rows.append(
            PagedRow(sequence.tokens[sequence.cached : end], sequence.cached, sequence.blocks)
        )
    logits = paged_forward(model, cache, rows)
    assert logits.shape == (len(rows), VOCAB)
    for (sequence, _), row, row_logits in zip(plan, rows, logits, strict=True):
        sequence.cached += len(row.token_ids)
        expected = reference_last_logits(model, sequence.tokens[: sequence.cached])
        assert (row_logits - expected).abs().max().item() < 1e-4
        if sequence.cached == len(sequence.tokens):
            sequence.tokens.append(int(row_logits.argmax()))


@pytest.mark.parametrize(("block_size", "num_kv_heads"), [(1, 2), (4, 2), (16, 2), (4, 1), (4, 4)])
def test_paged_matches_no_cache(block_size, num_kv_heads):
    model = random_model(num_kv_heads)
    cache = PagedKVCache(model.config, num_blocks=64, block_size=block_size)
    pool = shuffled_pool(64, seed=block_size)
    lengths = [2 * block_size, block_size + 1, 1, 7, 13]  # exactly full, one over, ...
    a, b, c, d, e = (Sequence(random_tokens(n, seed=i)) for i, n in enumerate(lengths))
    with torch.no_grad():
        paged_step(model, cache, pool, [(a, None), (b, None)])
        paged_step(model, cache, pool, [(a, None), (c, None), (b, None), (d, None), (e, 6)])
        paged_step(model, cache, pool, [(e, None), (a, None), (c, None)])
        for _ in range(block_size + 1):
            paged_step(model, cache, pool, [(s, None) for s in (d, a, b, c, e)])


def test_resumed_row_prefills_prompt_and_generated_tokens():
    """A preempted sequence comes back with fresh blocks and recomputes everything it had."""
    model = random_model()
    cache = PagedKVCache(model.config, num_blocks=32, block_size=4)
    pool = shuffled_pool(32, seed=1)
    a, b = Sequence(random_tokens(9, seed=1)), Sequence(random_tokens(5, seed=2))
    with torch.no_grad():
        paged_step(model, cache, pool, [(a, None), (b, None)])
        for _ in range(3):
            paged_step(model, cache, pool, [(a, None), (b, None)])
        pool.free(b.blocks)
        b.blocks, b.cached = [], 0
        paged_step(model, cache, pool, [(a, None), (b, None)])
        paged_step(model, cache, pool, [(b, None), (a, None)])


def test_freed_block_does_not_leak_into_its_next_owner():
    """Fill blocks with one sequence, free them, hand them to another: same logits as fresh."""
    model = random_model()
    block_size = 4
    used = PagedKVCache(model.config, num_blocks=8, block_size=block_size)
    pool = BlockPool(8)
    with torch.no_grad():
        old = Sequence(random_tokens(30, seed=3))
        paged_step(model, used, pool, [(old, None)])
        pool.free(old.blocks)
        new_tokens = random_tokens(6, seed=4)  # ends mid-block: stale K/V after position 5
        reused = Sequence(list(new_tokens))
        paged_step(model, used, pool, [(reused, None)])
        assert set(reused.blocks) <= set(old.blocks)
        fresh = Sequence(list(new_tokens))
        paged_step(model, PagedKVCache(model.config, 8, block_size), BlockPool(8), [(fresh, None)])
        assert reused.tokens == fresh.tokens


def test_pad_positions_are_never_written():
    model = random_model()
    cache = PagedKVCache(model.config, num_blocks=6, block_size=4)
    rows = [PagedRow(random_tokens(9, seed=5), 0, [4, 1, 3]), PagedRow([7], 0, [0])]
    with torch.no_grad():
        logits = paged_forward(model, cache, rows)
    assert torch.isfinite(logits).all()
    written = cache.keys[0].abs().sum(dim=(2, 3)) != 0
    expected = torch.zeros(6, 4, dtype=torch.bool)
    expected[4, :] = expected[1, :] = True
    expected[3, 0] = expected[0, 0] = True
    assert torch.equal(written, expected)
    assert sum(len(row.token_ids) for row in rows) == 10


def test_table_too_short_is_rejected():
    model = random_model()
    cache = PagedKVCache(model.config, num_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="table has 1"):
        paged_forward(model, cache, [PagedRow(random_tokens(5, seed=6), 0, [2])])


def test_contiguous_matches_no_cache():
    model = random_model()
    cache = ContiguousKVCache(model.config, max_batch=3, max_seq_len=40)
    sequences = [random_tokens(n, seed=n) for n in (3, 11, 7)]
    with torch.no_grad():
        for row, tokens in enumerate(sequences):
            logits = contiguous_forward(model, cache, torch.tensor([tokens]), rows=[row])
            assert (logits - model(torch.tensor([tokens]))).abs().max().item() < 1e-4
            tokens.append(int(logits[0, -1].argmax()))
        for _ in range(6):
            last = torch.tensor([[tokens[-1]] for tokens in sequences])
            logits = contiguous_forward(model, cache, last)[:, -1]
            for tokens, row_logits in zip(sequences, logits, strict=True):
                expected = reference_last_logits(model, tokens)
                assert (row_logits - expected).abs().max().item() < 1e-4
                tokens.append(int(row_logits.argmax()))
    assert cache.lengths == [len(tokens) - 1 for tokens in sequences]


def test_contiguous_overflow_is_rejected():
    model = random_model()
    cache = ContiguousKVCache(model.config, max_batch=1, max_seq_len=4)
    with pytest.raises(ValueError, match="max_seq_len 4"):
        contiguous_forward(model, cache, torch.tensor([random_tokens(5, seed=7)]))


def prefilled(
    model: Llama, cache: PagedKVCache, pool: BlockPool, lengths: list[int]
) -> list[Sequence]:
    """Sequences of the given lengths, prefilled together, each with its greedy token pending."""
    sequences = [Sequence(random_tokens(n, seed=10 + n)) for n in lengths]
    paged_step(model, cache, pool, [(s, None) for s in sequences])
    return sequences


@pytest.mark.parametrize("prefill_at", [0, 2, 4])
def test_long_prefill_beside_decodes_matches_each_row_alone(prefill_at):
    """Decodes at different contexts share a forward with a prefill much longer than any:
    every row's logits are its sequence's alone through the uncached model. The prefill row
    first, between the decodes or last puts the decode rows together or apart in the packing."""
    model = random_model()
    cache = PagedKVCache(model.config, num_blocks=64, block_size=4)
    pool = shuffled_pool(64, seed=7)
    with torch.no_grad():
        decodes = prefilled(model, cache, pool, [3, 9, 16, 21])
        long_prefill = Sequence(random_tokens(60, seed=8))
        plan: list[tuple[Sequence, int | None]] = [(s, None) for s in decodes]
        plan.insert(prefill_at, (long_prefill, None))
        paged_step(model, cache, pool, plan)
        paged_step(model, cache, pool, plan)  # the prefill row now decodes too


def test_prefills_chunks_and_decodes_in_one_forward():
    """Two prefills of different lengths, a chunk resuming mid-sequence and decodes at
    different contexts: each row sees exactly its own positions."""
    model = random_model()
    cache = PagedKVCache(model.config, num_blocks=64, block_size=4)
    pool = shuffled_pool(64, seed=9)
    with torch.no_grad():
        a, b = prefilled(model, cache, pool, [6, 13])
        chunked = Sequence(random_tokens(30, seed=11))
        paged_step(model, cache, pool, [(a, None), (chunked, 10), (b, None)])
        fresh_long, fresh_short = Sequence(random_tokens(25, seed=12)), Sequence([5, 6])
        plan = [(fresh_long, None), (a, None), (chunked, 11), (b, None), (fresh_short, None)]
        paged_step(model, cache, pool, plan)


@pytest.mark.parametrize("lengths", [[5, 5, 5], [4, 4, 4], [1, 7, 12, 30]])
def test_decode_only_steps_at_equal_and_different_contexts(lengths):
    """Decode rows only, at one context for all (ending together, block-aligned or not) or
    at different ones: the same logits as each sequence alone through the uncached model."""
    model = random_model()
    cache = PagedKVCache(model.config, num_blocks=64, block_size=4)
    pool = shuffled_pool(64, seed=len(lengths))
    with torch.no_grad():
        sequences = prefilled(model, cache, pool, lengths)
        for _ in range(5):
            paged_step(model, cache, pool, [(s, None) for s in sequences])


def test_one_gathered_attention_serves_every_layer():
    """One `GatheredAttention`, built once, attends in every layer: each layer's output equals
    per-row causal attention over that layer's cached K/V plus the new K/V (1e-5)."""
    config = random_model().config
    block_size, num_layers = 4, config.num_hidden_layers
    cache = PagedKVCache(config, num_blocks=24, block_size=block_size)
    generator = torch.Generator().manual_seed(13)
    for stored in (*cache.keys, *cache.values):
        stored.copy_(torch.randn(stored.shape, generator=generator))
    rows = [
        PagedRow([1], 9, [3, 7, 0]),
        PagedRow(random_tokens(11, seed=14), 0, [5, 1, 9]),
        PagedRow([2], 2, [4]),
        PagedRow(random_tokens(6, seed=15), 5, [8, 2, 6]),
    ]
    attention = GatheredAttention(cache, rows)
    num_new = sum(len(row.token_ids) for row in rows)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    for layer in range(num_layers):
        q = torch.randn(1, num_new, heads, config.head_dim, generator=generator)
        k = torch.randn(1, num_new, kv_heads, config.head_dim, generator=generator)
        v = torch.randn(1, num_new, kv_heads, config.head_dim, generator=generator)
        out = attention.attend(layer, q, k, v)
        assert out.shape == q.shape
        first = 0
        for row in rows:
            end = row.start_position + len(row.token_ids)
            new = slice(first, first + len(row.token_ids))
            table = torch.tensor([row.block_ids])
            positions = torch.arange(end)[None]
            flat = flat_indices(table, positions, block_size)[0]
            keys = cache.keys[layer].flatten(0, 1)[flat]
            values = cache.values[layer].flatten(0, 1)[flat]
            start = row.start_position
            assert torch.equal(keys[start:], k[0, new]) and torch.equal(values[start:], v[0, new])
            expected = grouped_query_attention(
                q[:, new], keys[None], values[None], mask=causal_mask(positions[:, start:], end)
            )
            assert (out[:, new] - expected).abs().max().item() < 1e-5
            first = new.stop
