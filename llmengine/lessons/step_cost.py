"""Lesson 23's measurements of what one step costs: operators, matrix products, FLOP/s.

A "before" model runs one matrix product per projection through eager `F.linear` (a
`Llama(config)` given a state dict); an "after" model has its projections fused and its
weights MKL-packed (`prepare_for_speed(model, "packed")`, as `load_model(kernels="packed")`
does). Everything here takes a model as it is and measures or counts what its decode step
does, so the lesson, its test and any later benchmark read the two the same way.

Timings keep the fastest of a few repeats, on whatever threads torch was given: on a machine
shared with other work, the fastest run is the one least disturbed by it, which is what the
code itself costs. Counts (operators, FLOPs) are exact and the same on every machine.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import torch
import torch.nn.functional as F

from llmengine.bench.decode_step import prepare_decode_steps
from llmengine.bench.throughput import matrix_product_seconds, operator_counts
from llmengine.kv.blocks import blocks_for_length
from llmengine.kv.paged_cache import PagedKVCache
from llmengine.model.config import LlamaConfig
from llmengine.model.llama import Llama
from llmengine.runner.attention import PagedRow
from llmengine.runner.forward import paged_forward
from llmengine.speed.kernels import PackedWeight
from llmengine.speed.prepare import products

Key = TypeVar("Key", bound=Hashable)  # whatever names the models compared: a label, a tuple

# -- the two models ------------------------------------------------------------------------


def unprepared_twin(model: Llama) -> Llama:
    """A `Llama` with `model`'s config and weights and no preparation: one eager `F.linear`
    per projection, nothing fused, nothing packed (the "before" of this lesson)."""
    twin = Llama(model.config)
    twin.load_state_dict(model.state_dict())
    return twin.eval().requires_grad_(False)


# -- operators by kind ---------------------------------------------------------------------

MATRIX_PRODUCTS = "matrix products"
ATTENTION = "attention"
ELEMENTWISE = "element-wise"
LAYOUT = "reshapes, views, indexing"
OTHER = "other"
OPERATOR_KINDS = (MATRIX_PRODUCTS, ATTENTION, ELEMENTWISE, LAYOUT, OTHER)

# Operator names (the part between the namespace and the overload) of each kind; what is in
# none of them (reductions, tensor creation, reading a scalar back) counts as "other".
_KIND_OF_NAME = {
    **dict.fromkeys(("linear", "_mkl_linear", "mm", "addmm", "matmul", "bmm"), MATRIX_PRODUCTS),
    **dict.fromkeys(("scaled_dot_product_attention", "softmax", "_softmax"), ATTENTION),
    **dict.fromkeys(
        (
            "add", "sub", "mul", "div", "neg", "pow", "rsqrt", "reciprocal", "silu", "cos",
            "sin", "to", "_to_copy", "floor_divide", "remainder", "minimum", "maximum",
            "lt", "le", "gt", "ge", "eq", "ne", "where", "masked_fill", "logical_not",
        ),
        ELEMENTWISE,
    ),
    **dict.fromkeys(
        (
            "view", "reshape", "flatten", "unsqueeze", "squeeze", "transpose", "permute",
            "expand", "select", "slice", "split", "split_with_sizes", "chunk", "cat",
            "index", "index_put", "index_put_", "index_select", "index_copy_", "gather",
            "embedding", "contiguous", "clone", "copy_", "narrow", "unbind", "stack",
            "new_zeros", "new_empty", "empty_like",
        ),
        LAYOUT,
    ),
}  # fmt: skip


def operator_kind(operator: str) -> str:
    """The kind (one of `OPERATOR_KINDS`) of an operator named as `operator_counts` names it,
    `namespace.name.overload` (`aten.mul.Tensor`, `mkl._mkl_linear.default`)."""
    parts = operator.split(".")
    name = parts[1] if len(parts) > 1 else parts[0]
    return _KIND_OF_NAME.get(name, OTHER)


def operators_by_kind(counts: Counter[str]) -> dict[str, int]:
    """`counts` (operator name to calls) summed by kind, every kind present, in kind order."""
    totals = dict.fromkeys(OPERATOR_KINDS, 0)
    for operator, calls in counts.items():
        totals[operator_kind(operator)] += calls
    return totals


def decode_step_operators(model: Llama, rows: int = 32, context: int = 64) -> Counter[str]:
    """The operators one paged decode step of `rows` rows dispatches, `context` positions each
    already cached (`decode_step.prepare_decode_steps`), by operator name."""
    step = prepare_decode_steps(model, rows, context).paged
    with torch.inference_mode():
        return operator_counts(step)


def matrix_products_of(model: Llama) -> int:
    """The matrix products a forward of `model` runs as its code is prepared now: one per
    fused group, one per layer of a group that is not fused."""
    return len(products(model))


# -- FLOPs ---------------------------------------------------------------------------------


def weights_multiplied(config: LlamaConfig) -> int:
    """Weight entries each position of a step is multiplied by: every projection of every
    layer, and the output head (the embedding table, when tied, is used once as a product)."""
    hidden, head_dim = config.hidden_size, config.head_dim
    attention = (
        hidden * head_dim * (2 * config.num_attention_heads + 2 * config.num_key_value_heads)
    )
    mlp = 3 * hidden * config.intermediate_size
    return config.num_hidden_layers * (attention + mlp) + hidden * config.vocab_size


def decode_step_flops(config: LlamaConfig, rows: int, keys: int) -> int:
    """Floating-point operations of a decode step of `rows` rows, each attending `keys` keys.

    A multiply-add is two: 2 x rows x `weights_multiplied` for the matrix products, and per
    layer and query head, 2 x keys x head_dim for the scores and as many for the weighted sum
    of values. Norms, rotary, SiLU and the softmax are left out: they are a few operations per
    activation, not per weight.
    """
    products = 2 * rows * weights_multiplied(config)
    heads = config.num_hidden_layers * config.num_attention_heads
    return products + 4 * rows * keys * heads * config.head_dim


# -- timing --------------------------------------------------------------------------------


def _fastest_seconds(run: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    with torch.inference_mode():
        for _ in range(warmup):
            run()
        durations = []
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            durations.append(time.perf_counter() - start)
    return min(durations)


def decode_step_seconds(model: Llama, rows: int, context: int = 64, repeats: int = 5) -> float:
    """Fastest seconds of one paged decode step of `rows` rows over `context` cached positions."""
    return _fastest_seconds(prepare_decode_steps(model, rows, context).paged, repeats)


@dataclass(frozen=True, slots=True)
class DecodeCost:
    """One decode step of `rows` rows, timed whole and as its matrix products alone."""

    rows: int
    step_s: float
    products_s: float
    step_flops: int
    product_flops: int

    @property
    def products_share(self) -> float:
        """The part of the step the matrix products alone would take."""
        return self.products_s / self.step_s

    @property
    def step_flop_rate(self) -> float:
        """FLOP/s the whole step achieves: its FLOPs over its seconds."""
        return self.step_flops / self.step_s

    @property
    def products_flop_rate(self) -> float:
        """FLOP/s of the products run alone: the most this machine's BLAS gives these shapes,
        the practical roofline of a step made of them."""
        return self.product_flops / self.products_s


def decode_cost(model: Llama, rows: int, context: int = 64, repeats: int = 5) -> DecodeCost:
    """Time a `rows`-row decode step over `context` cached positions and its products alone.

    Each new position attends to its `context` cached keys and its own.
    """
    config = model.config
    return DecodeCost(
        rows=rows,
        step_s=decode_step_seconds(model, rows, context, repeats),
        products_s=matrix_product_seconds(model, rows, repeats, fastest=True),
        step_flops=decode_step_flops(config, rows, context + 1),
        product_flops=2 * rows * weights_multiplied(config),
    )


def fastest_decode_costs(
    models: Mapping[Key, Llama],
    row_counts: Sequence[int],
    context: int = 64,
    repeats: int = 3,
    rounds: int = 3,
) -> dict[Key, dict[int, DecodeCost]]:
    """`decode_cost` of every model at every row count, over `rounds` rounds taken in turn,
    each cell keeping its fastest step and its fastest products.

    On a shared machine a busy stretch lasts longer than a cell's repeats; spread over rounds,
    it slows one round of a cell rather than all of them, and the models compared with each
    other are measured side by side.
    """
    costs: dict[Key, dict[int, DecodeCost]] = {key: {} for key in models}
    for _ in range(rounds):
        for rows in row_counts:
            for key, model in models.items():
                cost = decode_cost(model, rows, context, repeats)
                best = costs[key].get(rows, cost)
                costs[key][rows] = replace(
                    cost,
                    step_s=min(cost.step_s, best.step_s),
                    products_s=min(cost.products_s, best.products_s),
                )
    return costs


def count_changes(before: Counter[str], after: Counter[str]) -> list[tuple[str, int, int]]:
    """`(operator, calls before, calls after)` for every operator whose count differs, the
    largest change first (ties by name)."""
    changed = [(op, before[op], after[op]) for op in before | after if before[op] != after[op]]
    return sorted(changed, key=lambda change: (-abs(change[2] - change[1]), change[0]))


@dataclass(frozen=True, slots=True)
class PackingTiming:
    """One weight times `rows` rows: eager `F.linear` against MKL's packed product."""

    rows: int
    eager_s: float
    packed_s: float

    @property
    def speedup(self) -> float:
        return self.eager_s / self.packed_s


def packing_timings(
    weight: torch.Tensor, row_counts: Iterable[int], repeats: int = 20
) -> list[PackingTiming]:
    """For each row count, the fastest seconds of `F.linear(x, weight)` and of the same product
    through a `PackedWeight` packed once beforehand; the two results must agree."""
    packed = PackedWeight(weight)
    timings = []
    for rows in row_counts:
        x = torch.randn(rows, weight.shape[1], dtype=weight.dtype)
        torch.testing.assert_close(
            packed.packed_linear(x), F.linear(x, weight), rtol=1e-4, atol=1e-5
        )
        eager = _fastest_seconds(lambda x=x: F.linear(x, weight), repeats)
        packed_s = _fastest_seconds(lambda x=x: packed.packed_linear(x), repeats)
        timings.append(PackingTiming(rows, eager, packed_s))
    return timings


# -- a prefill beside decodes --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MixedStepTiming:
    """Fastest seconds of one step carrying a prefill and decodes, and of each part alone."""

    mixed_s: float
    prefill_s: float
    decodes_s: float

    @property
    def against_parts(self) -> float:
        """The mixed step over the sum of its parts: 1 when putting them together costs
        nothing extra, above 1 when one part makes the other dearer (padding, say)."""
        return self.mixed_s / (self.prefill_s + self.decodes_s)


def mixed_step_seconds(
    model: Llama,
    *,
    prefill: int = 192,
    decodes: int = 15,
    context: int = 64,
    block_size: int = 16,
    repeats: int = 5,
    seed: int = 23,
) -> MixedStepTiming:
    """Time one `paged_forward` of a `prefill`-token prompt beside `decodes` decode rows (each
    with `context` cached positions), the prompt alone, and the decodes alone.

    The decode rows' context is prefilled once first. Each timed forward writes the same K/V
    to the same positions every time, so the three can be repeated, in turn, as often as
    wanted.
    """
    generator = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    decode_blocks = blocks_for_length(context + 1, block_size)
    prefill_blocks = blocks_for_length(prefill, block_size)
    cache = PagedKVCache(
        model.config, decodes * decode_blocks + prefill_blocks, block_size, dtype=torch.float32
    )
    tables = [list(range(i * decode_blocks, (i + 1) * decode_blocks)) for i in range(decodes)]
    contexts = torch.randint(0, vocab, (decodes, context + 1), generator=generator).tolist()
    prompt = torch.randint(0, vocab, (prefill,), generator=generator).tolist()
    decode_rows = [
        PagedRow(tokens[context:], context, table)
        for tokens, table in zip(contexts, tables, strict=True)
    ]
    prefill_row = PagedRow(prompt, 0, list(range(decodes * decode_blocks, cache.num_blocks)))
    with torch.inference_mode():
        paged_forward(
            model,
            cache,
            [PagedRow(tokens[:context], 0, t) for tokens, t in zip(contexts, tables, strict=True)],
        )
    steps = {
        "mixed": lambda: paged_forward(model, cache, [prefill_row, *decode_rows]),
        "prefill": lambda: paged_forward(model, cache, [prefill_row]),
        "decodes": lambda: paged_forward(model, cache, decode_rows),
    }
    durations: dict[str, list[float]] = {name: [] for name in steps}
    with torch.inference_mode():
        for step in steps.values():
            step()
        for _ in range(repeats):
            for name, step in steps.items():
                start = time.perf_counter()
                step()
                durations[name].append(time.perf_counter() - start)
    return MixedStepTiming(*(min(durations[name]) for name in steps))


# -- the benchmark's report ----------------------------------------------------------------


def markdown_sections(path: str | Path, headings: Sequence[str]) -> str:
    """The `## ` sections of a Markdown file whose headings start with one of `headings`, in
    the file's order, each from its heading to the next `## ` heading.

    Raises ValueError when one of `headings` starts no section: a report rewritten under new
    headings should fail loudly, not show nothing.
    """
    sections: list[tuple[str, list[str]]] = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            sections.append((line[3:].strip(), []))
        if sections:
            sections[-1][1].append(line)
    chosen = [lines for title, lines in sections if title.startswith(tuple(headings))]
    for heading in headings:
        if not any(title.startswith(heading) for title, _ in sections):
            raise ValueError(f"{path} has no section headed {heading!r}")
    return "\n".join("\n".join(lines).strip() + "\n" for lines in chosen)


def markdown_column(text: str, column: str) -> list[str]:
    """The cells under `column` in every Markdown table of `text`, top to bottom.

    Raises ValueError when no table of `text` has that column.
    """
    cells: list[str] = []
    found = False
    header: list[str] | None = None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        row = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if header is None:
            header = row
            found = found or column in header
        elif column in header and not set(line) <= set("|-: "):
            cells.append(row[header.index(column)])
    if not found:
        raise ValueError(f"no table has a column {column!r}")
    return cells
