"""Two choices the big engines make differently from llmengine, measured on llmengine itself.

- **How finely a prefix is reused.** vLLM and TensorRT-LLM share whole blocks, as llmengine
  does; SGLang's radix tree, with its default page of one token, can end a match anywhere.
  llmengine's own engine with `block_size=1` is such a token-granular cache, so the same two
  prompts run at several block sizes show what the granularity costs, in positions computed.
- **How many bytes a token of context costs.** A token's K/V is two vectors per layer per
  K/V head; the engine's pool says how many bytes that is for the embedded model, and the
  same count for Llama 3 8B's shape, in the formats the peers store K/V in, says how many
  tokens a memory budget holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import llmengine
from llmengine.model.config import LlamaConfig
from llmengine.runner.loading import load_model
from llmengine.speed.prepare import PreparedLlama

PROMPT_SEED = 30


@dataclass(frozen=True, slots=True)
class SharedPrefixRun:
    """Two prompts with a common start, the second run after the first has finished, and
    how much of the second the engine took from the cache and computed."""

    block_size: int
    shared: int
    second_prompt: int
    taken: int
    computed: int


def shared_prefix_prompts(shared: int, own: int, vocab_size: int) -> tuple[list[int], list[int]]:
    """Two seeded prompts of `shared + own` token ids that agree on their first `shared` only."""
    generator = torch.Generator().manual_seed(PROMPT_SEED)

    def draw(count: int) -> list[int]:
        return torch.randint(3, vocab_size, (count,), generator=generator).tolist()

    common = draw(shared)
    first, second = common + draw(own), common + draw(own)
    if own and first[shared] == second[shared]:
        raise ValueError("the seeded prompts agree past the shared prefix; change PROMPT_SEED")
    return first, second


def run_one_after_another(
    model: PreparedLlama, prompts: list[list[int]], block_size: int, max_tokens: int = 1
) -> list[llmengine.IterationOutcome]:
    """Each prompt alone on a prefix-caching engine, greedy, the next one added only once the
    one before has finished (so it can find every block the earlier ones filled). Returns
    every step's outcome; a pool roomy enough that no cached block is handed out again."""
    total = sum(len(prompt) + max_tokens for prompt in prompts)
    engine = llmengine.Engine(
        model,
        num_blocks=-(-total // block_size) + len(prompts),
        block_size=block_size,
        num_slots=1,
        enable_prefix_caching=True,
    )
    greedy = llmengine.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    outcomes = []
    for prompt in prompts:
        engine.add_request(prompt, greedy)
        while engine.has_unfinished():
            outcomes.append(engine.step())
    return outcomes


def shared_prefix_run(
    model: PreparedLlama, shared: int, own: int, block_size: int
) -> SharedPrefixRun:
    """The two prompts of `shared_prefix_prompts`, one after the other, at `block_size`."""
    first, second = shared_prefix_prompts(shared, own, model.config.vocab_size)
    outcomes = run_one_after_another(model, [first, second], block_size)
    taken = sum(outcome.cached_tokens for outcome in outcomes)
    # The second prompt's prefill is the step after the first request's only step.
    computed = outcomes[1].forward_tokens
    return SharedPrefixRun(block_size, shared, len(second), taken, computed)


def block_rule(shared: int, prompt_len: int, block_size: int) -> int:
    """Positions a block-granular cache hands a prompt: the whole blocks inside the shared
    prefix, never the block holding the prompt's last token (its logits must be computed)."""
    return min(shared // block_size, (prompt_len - 1) // block_size) * block_size


def token_rule(shared: int, prompt_len: int) -> int:
    """Positions a token-granular cache hands a prompt: all it shares but the last token."""
    return min(shared, prompt_len - 1)


@dataclass(frozen=True, slots=True)
class KVShape:
    """What one token's K/V holds: keys and values, per layer, per K/V head."""

    layers: int
    kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, config: LlamaConfig) -> KVShape:
        return cls(config.num_hidden_layers, config.num_key_value_heads, config.head_dim)

    def values_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim

    def bytes_per_token(self, bytes_per_value: float) -> float:
        return self.values_per_token() * bytes_per_value


# Meta-Llama-3-8B's config.json: 32 layers, 8 K/V heads, hidden size 4096 over 32 heads.
LLAMA3_8B = KVShape(layers=32, kv_heads=8, head_dim=4096 // 32)

# Bytes per stored value, and the source for the two block formats: llama.cpp's q8_0 keeps
# 32 int8 values and one float16 scale (34 bytes), q4_0 32 four-bit values and a scale (18).
KV_FORMATS: tuple[tuple[str, float], ...] = (
    ("float32", 4.0),
    ("bfloat16", 2.0),
    ("fp8", 1.0),
    ("q8_0", 34 / 32),
    ("q4_0", 18 / 32),
)


def pool_bytes_per_token(dtype: str, block_size: int = 16) -> int:
    """Bytes the engine's pool spends per token of context for the embedded model loaded in
    `dtype`: a block's bytes across every layer, keys and values, over its tokens."""
    model = load_model(dtype=dtype, kernels="eager")
    engine = llmengine.Engine(model, num_blocks=1, block_size=block_size, num_slots=1)
    return engine.runner.cache.bytes_per_block // block_size


GRANULARITY_HEADERS = (
    "block size",
    "block-table entries",
    "taken from the cache",
    "computed",
    "lost to blocks",
)


def granularity_rows(
    model: PreparedLlama, shared: int, own: int, block_sizes: tuple[int, ...]
) -> list[tuple[int, int, int, int, int]]:
    """One row per block size: the second prompt's block-table entries, the positions it
    took from the cache and computed, and what blocks lost against a token-granular cache,
    which is the engine itself with blocks of one token (measured, not assumed)."""
    runs = {size: shared_prefix_run(model, shared, own, size) for size in {1, *block_sizes}}
    token_granular = runs[1].taken
    rows = []
    for block_size in block_sizes:
        run = runs[block_size]
        entries = -(-run.second_prompt // block_size)
        rows.append((block_size, entries, run.taken, run.computed, token_granular - run.taken))
    return rows


KV_HEADERS = ("model", "K/V format", "values per token", "bytes per token", "tokens per GiB")
GIB = 1 << 30


def kv_rows(config: LlamaConfig) -> list[tuple[str, str, int, float, int]]:
    """Bytes per token of context: the embedded model's as its engine pool spends them (in
    float32 and bfloat16, each checked against the count), then Llama 3 8B's shape counted in
    every format of `KV_FORMATS`."""
    embedded = KVShape.of(config)
    rows = []
    for kv_format, size in KV_FORMATS[:2]:
        spent = pool_bytes_per_token(kv_format)
        counted = embedded.bytes_per_token(size)
        if spent != counted:
            raise RuntimeError(f"the {kv_format} pool spends {spent} bytes a token, not {counted}")
        rows.append(("embedded (engine's pool)", kv_format, embedded.values_per_token(), spent))
    for kv_format, size in KV_FORMATS:
        per_token = LLAMA3_8B.bytes_per_token(size)
        rows.append(("Llama 3 8B (count)", kv_format, LLAMA3_8B.values_per_token(), per_token))
    return [(*row, int(GIB // row[3])) for row in rows]
