"""Throughput against transformers: the same weights and the same requests, served three ways.

- `llmengine`: one `Engine` with a slot for every request and a pool that holds every
  request's worst case, so nobody waits for a slot and nobody is preempted; `llmengine
  compiled` is the same with `Engine(..., compile=True)`.
- `generate`: transformers' `generate` over all the requests in one left-padded batch, greedy,
  run for the longest budget. One call, one rectangle: static batching at its strongest, and
  a request's tokens past its own budget are computed for nobody.
- `generate_batch`: transformers' own continuous batching, through the manager that
  `generate_batch` wraps, fed request by request so that each keeps its own budget
  (`generate_batch` takes one `max_new_tokens` for all), its cache sized like the pool above.

Only useful tokens count: what each request asked for, whatever an engine computed beyond it.
Every runner returns the tokens it generated, so the engines are checked against each other
before any speed is believed. `profile_steps` splits the engine's own step time into the
model's forward and everything around it; `decode_step_cost` sets one decode step against its
matrix products alone. `compiled_runners` adds transformers' compiled `generate`.
"""

from __future__ import annotations

import os
import platform
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from llmengine.bench.decode_step import BENCH_SHAPE, prepare_decode_steps, time_decode_step
from llmengine.bench.workloads import RequestSpec
from llmengine.engine import Engine
from llmengine.kv.blocks import blocks_for_length
from llmengine.model.llama import Llama
from llmengine.speed.prepare import products

if TYPE_CHECKING:
    import transformers

ENGINES = ("llmengine", "generate", "generate_batch")
PAD_TOKEN_ID = 0  # left padding; masked out, so any id works
# -- the same weights for both libraries ---------------------------------------------------


def save_random_checkpoint(
    folder: str | Path, *, seed: int = 0, max_shard_size: str | None = None, **shape: Any
) -> transformers.LlamaForCausalLM:
    """Build a seeded random `LlamaForCausalLM` (BENCH_SHAPE unless overridden), save it into
    `folder` (sharded when `max_shard_size` is given) and return it in eval mode."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**{**BENCH_SHAPE, **shape})
    model = transformers.LlamaForCausalLM(config).eval()
    sharding = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(folder, **sharding)
    return model


def load_both(path: str | Path) -> tuple[Llama, transformers.LlamaForCausalLM]:
    """The checkpoint in `path` loaded twice: by llmengine, and by transformers (float32, eval)."""
    import transformers

    from llmengine.runner.loading import load_model

    reference = transformers.LlamaForCausalLM.from_pretrained(path, dtype=torch.float32)
    return load_model(path), reference.eval().requires_grad_(False)


def parameter_count(model: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


# -- what a run produced --------------------------------------------------------------------


def prompts_of(workload: Sequence[RequestSpec]) -> list[list[int]]:
    return [list(spec.prompt_token_ids) for spec in workload]


def budgets_of(workload: Sequence[RequestSpec]) -> list[int]:
    return [spec.params.max_tokens for spec in workload]


def useful_tokens(outputs: Sequence[Sequence[int]], workload: Sequence[RequestSpec]) -> int:
    """Tokens the requests asked for and got: each output counted up to its own budget."""
    if len(outputs) != len(workload):
        raise ValueError(f"{len(outputs)} outputs for {len(workload)} requests")
    return sum(
        min(len(out), budget) for out, budget in zip(outputs, budgets_of(workload), strict=True)
    )


@dataclass(frozen=True, slots=True)
class EngineRun:
    """One engine serving one workload: wall seconds for the whole call, tokens per request."""

    engine: str
    seconds: float
    outputs: list[list[int]]
    useful_tokens: int

    @property
    def tokens_per_s(self) -> float:
        return self.useful_tokens / self.seconds


def speedup(run: EngineRun, baseline: EngineRun) -> float:
    """How many times more useful tokens per second `run` delivered than `baseline`."""
    return run.tokens_per_s / baseline.tokens_per_s


def _timed(
    engine: str, workload: Sequence[RequestSpec], serve: Callable[[], list[list[int]]]
) -> EngineRun:
    start = time.perf_counter()
    outputs = serve()
    seconds = time.perf_counter() - start
    return EngineRun(engine, seconds, outputs, useful_tokens(outputs, workload))


# -- the three runners ------------------------------------------------------------------------


def pool_blocks(workload: Sequence[RequestSpec], block_size: int) -> int:
    """Blocks that hold every request's prompt plus its whole budget at once."""
    return sum(
        blocks_for_length(len(spec.prompt_token_ids) + spec.params.max_tokens, block_size)
        for spec in workload
    )


def run_llmengine(
    model: Llama, workload: Sequence[RequestSpec], block_size: int = 16, *, compile: bool = False
) -> EngineRun:
    """A fresh engine with one slot per request and a pool for all of them, run to the end.

    With `compile`, the engine is built with `compile=True` (its step through torch.compile).
    """

    def serve() -> list[list[int]]:
        engine = Engine(
            model,
            num_blocks=pool_blocks(workload, block_size),
            block_size=block_size,
            num_slots=len(workload),
            compile=compile,
        )
        return engine.generate(prompts_of(workload), [spec.params for spec in workload])

    return _timed("llmengine compiled" if compile else "llmengine", workload, serve)


def run_on_engine(engine: Engine, workload: Sequence[RequestSpec]) -> EngineRun:
    """`workload` through an engine built beforehand (its construction is not timed)."""
    params = [spec.params for spec in workload]
    return _timed("llmengine", workload, lambda: engine.generate(prompts_of(workload), params))


def left_padded(prompts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts as one `[batch, longest]` rectangle padded on the left, and its attention mask."""
    width = max(len(prompt) for prompt in prompts)
    ids = [[PAD_TOKEN_ID] * (width - len(prompt)) + list(prompt) for prompt in prompts]
    mask = [[0] * (width - len(prompt)) + [1] * len(prompt) for prompt in prompts]
    return torch.tensor(ids), torch.tensor(mask)


def run_generate(
    hf_model: transformers.LlamaForCausalLM,
    workload: Sequence[RequestSpec],
    *,
    engine: str = "generate",
    **generate_options: Any,
) -> EngineRun:
    """transformers `generate`, greedy, every request in one left-padded batch.

    The batch runs for the longest budget with no end token, so every row is as long as that;
    each request keeps only its own budget's tokens. `generate_options` go to `generate` as
    they are (a cache implementation, a compile configuration), under the name `engine`.
    """
    budgets = budgets_of(workload)

    def serve() -> list[list[int]]:
        input_ids, attention_mask = (
            tensor.to(hf_model.device) for tensor in left_padded(prompts_of(workload))
        )
        with torch.inference_mode():
            out = hf_model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                max_new_tokens=max(budgets),
                do_sample=False,
                eos_token_id=None,
                pad_token_id=PAD_TOKEN_ID,
                **generate_options,
            )
        generated = out[:, input_ids.shape[1] :].tolist()
        return [row[:budget] for row, budget in zip(generated, budgets, strict=True)]

    return _timed(engine, workload, serve)


def run_generate_batch(
    hf_model: transformers.LlamaForCausalLM,
    workload: Sequence[RequestSpec],
    block_size: int = 16,
) -> EngineRun:
    """transformers' continuous batching, each request with its own budget and no end token.

    The cache is sized as `run_llmengine` sizes its pool (pages of `block_size` tokens, room
    for every request's worst case) and a forward may take every prompt at once, as the
    engine's first step does. Its defaults are sized for a GPU (a cache from the free memory,
    batches of 8192 tokens with an attention mask to match) and make a call on a CPU take
    seconds before any work; `run_generate_batch_default` measures that. Prefix sharing is
    off: llmengine has none.
    """
    import inspect

    import transformers

    prompts, budgets = prompts_of(workload), budgets_of(workload)
    # The page size's keyword: `block_size` in transformers 5.17 (the GPU image's), renamed
    # `page_size` later, which keeps `block_size` as a deprecated alias that warns.
    accepted = inspect.signature(transformers.ContinuousBatchingConfig).parameters
    page_keyword = "page_size" if "page_size" in accepted else "block_size"

    def serve() -> list[list[int]]:
        generation = transformers.GenerationConfig(
            do_sample=False, max_new_tokens=max(budgets), eos_token_id=-1, pad_token_id=PAD_TOKEN_ID
        )
        batching = transformers.ContinuousBatchingConfig(
            **{page_keyword: block_size},
            num_blocks=pool_blocks(workload, block_size),
            max_batch_tokens=sum(len(prompt) for prompt in prompts),
            max_requests_per_batch=len(workload),
            allow_block_sharing=False,
        )
        results: dict[str, Any] = {}
        with hf_model.continuous_batching_context_manager(
            generation_config=generation, continuous_batching_config=batching, timeout=5
        ) as manager:
            ids = [
                manager.add_request(prompt, request_id=f"r{index}", max_new_tokens=budget)
                for index, (prompt, budget) in enumerate(zip(prompts, budgets, strict=True))
            ]
            while len(results) < len(ids):
                result = manager.get_result(timeout=1)
                if result is None:
                    if not manager.is_running():
                        raise RuntimeError("transformers' generation thread stopped early")
                    continue
                if result.error is not None:
                    raise RuntimeError(f"generate_batch {result.request_id}: {result.error}")
                if result.is_finished():
                    results[result.request_id] = result
        return [list(results[request_id].generated_tokens) for request_id in ids]

    return _timed("generate_batch", workload, serve)


def run_generate_batch_default(
    hf_model: transformers.LlamaForCausalLM, workload: Sequence[RequestSpec]
) -> EngineRun:
    """`generate_batch` called as its documentation shows, every setting left at its default.

    It takes one budget for all requests, so the workload must have one. The comparison with
    `run_generate_batch` shows what the defaults, sized for a GPU, cost on a CPU.
    """
    import transformers

    budgets = set(budgets_of(workload))
    if len(budgets) != 1:
        raise ValueError(f"generate_batch takes one max_new_tokens, the workload has {budgets}")
    (budget,) = budgets

    def serve() -> list[list[int]]:
        generation = transformers.GenerationConfig(do_sample=False, eos_token_id=-1)
        results = hf_model.generate_batch(
            prompts_of(workload), generation_config=generation, max_new_tokens=budget
        )
        return [list(result.generated_tokens) for result in results.values()]

    return _timed("generate_batch (defaults)", workload, serve)


# -- checking the tokens -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Agreement:
    """How far two engines' tokens agree: whole requests, and tokens before the first difference."""

    identical: int
    requests: int
    matching_tokens: int
    tokens: int


def agreement(
    reference: Sequence[Sequence[int]],
    other: Sequence[Sequence[int]],
    among: Sequence[int] | None = None,
) -> Agreement:
    """Compare `other` with `reference`, request by request (only the indices `among`, if given)."""
    if len(reference) != len(other):
        raise ValueError(f"{len(reference)} reference outputs but {len(other)} to compare")
    indices = range(len(reference)) if among is None else among
    identical = matching = total = 0
    for index in indices:
        expected, got = list(reference[index]), list(other[index])
        identical += expected == got
        total += len(expected)
        for a, b in zip(expected, got, strict=False):
            if a != b:
                break
            matching += 1
    return Agreement(identical, len(indices), matching, total)


def unpadded_requests(workload: Sequence[RequestSpec]) -> list[int]:
    """Requests with the longest prompt: in a left-padded batch they are the rows with no pad.

    Padding is masked, so in exact arithmetic it changes nobody's tokens; in float32 a padded
    row's sums run over a different shape, and a near tie in the argmax may flip. Where there
    is no pad, only the batching itself differs.
    """
    longest = max(len(spec.prompt_token_ids) for spec in workload)
    return [i for i, spec in enumerate(workload) if len(spec.prompt_token_ids) == longest]


# -- timing the three, fairly ----------------------------------------------------------------

Runner = Callable[[Sequence[RequestSpec]], EngineRun]


def median_run(runs: Sequence[EngineRun]) -> EngineRun:
    """The run of median duration; every run must have produced the same tokens."""
    for run in runs[1:]:
        if run.outputs != runs[0].outputs:
            raise RuntimeError(f"{run.engine} generated different tokens on a repeat")
    return sorted(runs, key=lambda run: run.seconds)[(len(runs) - 1) // 2]


def failure_reason(error: Exception) -> str:
    """What a report says in place of an engine's numbers when it raised `error`."""
    first_line = (str(error).strip().splitlines() or [""])[0]
    return f"did not run: {type(error).__name__}: {first_line[:160]}"


@dataclass(frozen=True, slots=True)
class Comparison:
    """Runners against one workload: median runs, each warm-up's seconds, and who failed why."""

    runs: dict[str, EngineRun]
    warmup_seconds: dict[str, float]
    failures: dict[str, str]

    def first_call_extra_s(self, engine: str) -> float:
        """What the untimed first call cost beyond a timed one: compilation, for a compiler."""
        return self.warmup_seconds[engine] - self.runs[engine].seconds


def compare(
    runners: Mapping[str, Runner],
    workload: Sequence[RequestSpec],
    *,
    repeats: int = 3,
    warmup: int | None = 2,
) -> Comparison:
    """Each runner's median run of `workload`, over `repeats` rounds taken in turn.

    Every runner first serves the first `warmup` requests untimed (the whole workload when
    `warmup` is None: a compiler then compiles for the very shapes timed after), so one-time
    start-up costs are billed to nobody; then the rounds interleave the runners, so a stretch
    of time when the machine is busy with something else slows all of them alike. A runner
    that raises is dropped from the rounds and its reason kept, and the others go on.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    warmup_workload = workload if warmup is None else workload[:warmup]
    warmup_seconds: dict[str, float] = {}
    failures: dict[str, str] = {}
    runs: dict[str, list[EngineRun]] = {}
    for name, runner in runners.items():
        start = time.perf_counter()
        try:
            if warmup_workload:
                runner(warmup_workload)
        except Exception as error:  # reported in the engine's place, not raised
            failures[name] = failure_reason(error)
            continue
        warmup_seconds[name] = time.perf_counter() - start
        runs[name] = []
    for _ in range(repeats):
        for name in list(runs):
            try:
                runs[name].append(runners[name](workload))
            except Exception as error:  # reported in the engine's place, not raised
                failures[name] = failure_reason(error)
                del runs[name], warmup_seconds[name]
    medians = {name: median_run(engine_runs) for name, engine_runs in runs.items()}
    return Comparison(medians, warmup_seconds, failures)


def compare_engines(
    runners: Mapping[str, Runner],
    workload: Sequence[RequestSpec],
    *,
    repeats: int = 3,
    warmup: int | None = 2,
) -> dict[str, EngineRun]:
    """`compare`'s median runs, for runners that must all work: a failure is raised."""
    comparison = compare(runners, workload, repeats=repeats, warmup=warmup)
    if comparison.failures:
        raise RuntimeError(f"engines failed: {comparison.failures}")
    return comparison.runs


def standard_runners(
    model: Llama, hf_model: transformers.LlamaForCausalLM, block_size: int = 16
) -> dict[str, Runner]:
    """The three engines of this module on one pair of identical models, in ENGINES order."""
    return {
        "llmengine": lambda workload: run_llmengine(model, workload, block_size),
        "generate": lambda workload: run_generate(hf_model, workload),
        "generate_batch": lambda workload: run_generate_batch(hf_model, workload, block_size),
    }


# -- where an engine step's time goes ------------------------------------------------------

PHASES = ("schedule", "index building", "model forward", "sampling", "update", "bookkeeping")
FORWARD_PHASE = "model forward"


@dataclass(frozen=True, slots=True)
class StepProfile:
    """Seconds per phase of `Engine.step`, summed over `steps` steps.

    - schedule: `Scheduler.schedule` (grow, swap in, admit);
    - index building: the rows' block tables and flat-index/position/mask tensors, built once
      per step before the forward (and, under preemption by swap, the block copies before it);
    - model forward: `forward_hidden` and `compute_logits` (the per-layer cache writes and
      gathers happen inside it, and count here);
    - sampling: logits to one token per row;
    - update: `Scheduler.update` (tokens appended, finished requests released);
    - bookkeeping: the outcome's counters and the pool's numbers after the step.
    """

    steps: int
    seconds: dict[str, float]

    @property
    def total_s(self) -> float:
        return sum(self.seconds.values())

    def share(self, phase: str) -> float:
        return self.seconds[phase] / self.total_s

    @property
    def outside_forward_share(self) -> float:
        """The part of step time not spent in the model's forward."""
        return 1.0 - self.share(FORWARD_PHASE)


def _marking(method: Callable[..., Any], marks: list[float]) -> Callable[..., Any]:
    def marked(*args: Any, **kwargs: Any) -> Any:
        marks.append(time.perf_counter())
        result = method(*args, **kwargs)
        marks.append(time.perf_counter())
        return result

    return marked


@contextmanager
def _phase_marks(engine: Engine) -> Iterator[list[float]]:
    """Timestamps at the entry and exit of the four calls `Engine.step` makes, in order.

    The wrappers are set on the instances and removed afterwards, so the engine's code carries
    no timing of its own and other engines are untouched.
    """
    marks: list[float] = []
    calls = [
        (engine.scheduler, "schedule"),
        (engine.model, "forward_hidden"),
        (engine.model, "compute_logits"),
        (engine.scheduler, "update"),
    ]
    for owner, name in calls:
        setattr(owner, name, _marking(getattr(owner, name), marks))
    try:
        yield marks
    finally:
        for owner, name in calls:
            delattr(owner, name)


def profile_steps(engine: Engine, workload: Sequence[RequestSpec]) -> StepProfile:
    """Add `workload` to `engine`, step it to the end, and split each step's time by phase.

    Each step's phases add up to its wall time, read from timestamps around the calls `step`
    makes: schedule, forward_hidden, compute_logits, update.
    """
    for spec in workload:
        engine.add_request(list(spec.prompt_token_ids), spec.params)
    seconds = dict.fromkeys(PHASES, 0.0)
    steps = 0
    with _phase_marks(engine) as marks:
        while engine.has_unfinished():
            marks.clear()
            start = time.perf_counter()
            engine.step()
            end = time.perf_counter()
            if len(marks) != 8:
                raise RuntimeError(f"expected 4 timed calls in a step, saw {len(marks) // 2}")
            _, scheduled, forward, _, _, logits, updating, updated = marks
            bounds = [start, scheduled, forward, logits, updating, updated, end]
            for phase, (begin, finish) in zip(PHASES, pairwise(bounds), strict=True):
                seconds[phase] += finish - begin
            steps += 1
    return StepProfile(steps, seconds)


# -- what a forward is made of -------------------------------------------------------------


def operator_counts(run: Callable[[], object]) -> Counter[str]:
    """How many times `run` dispatches each PyTorch operator, by name (`aten.mm.default`, ...).

    Only the operators called from Python count, not those they call in turn. Counted by a
    dispatch mode rather than `torch.profiler`, which prints to the terminal.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counting(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.counts: Counter[str] = Counter()

        def __torch_dispatch__(
            self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
        ) -> Any:
            self.counts[str(func)] += 1
            return func(*args, **(kwargs or {}))

    counting = Counting()
    with counting:
        run()
    return counting.counts


def operator_calls(run: Callable[[], object]) -> int:
    """How many PyTorch operators `run` dispatches in all (see `operator_counts`)."""
    return sum(operator_counts(run).values())


def decode_weights(model: Llama) -> list[torch.Tensor]:
    """The weight matrices a decode step multiplies each row by, once each.

    Every linear layer's, and the embedding table only when it is also the output projection
    (otherwise it is just looked up).
    """
    weights = [layer.weight for layer in model.modules() if isinstance(layer, torch.nn.Linear)]
    if model.lm_head is None:
        weights.append(model.embed_tokens.weight)
    return weights


def matrix_product_seconds(
    model: Llama, rows: int, repeats: int = 5, *, fastest: bool = False
) -> float:
    """Wall time of only the matrix products of a `rows`-row decode step, run back to back.

    The products are the ones the model's forward runs: each of `speed.products(model)` on a
    `[rows, in]` block of random activations, so a fused and packed model is timed through its
    fused, packed products and a model built from its parts through one product per layer.
    One untimed pass, then the median of `repeats` passes (the fastest with `fastest`, to set
    against a step timed the same way). A real step takes longer by whatever else it does:
    the other operators, and the fixed cost of launching each one.
    """
    groups = products(model)
    parameter = next(model.parameters())
    inputs = [
        torch.randn(rows, group.weight.shape[1], dtype=parameter.dtype).to(parameter.device)
        for group in groups
    ]
    durations = []
    with torch.inference_mode():
        for _ in range(repeats + 1):
            start = time.perf_counter()
            for group, activations in zip(groups, inputs, strict=True):
                group(activations)
            durations.append(time.perf_counter() - start)
    timed = sorted(durations[1:])
    return timed[0] if fastest else timed[(len(timed) - 1) // 2]


@dataclass(frozen=True, slots=True)
class DecodeStepCost:
    """One `rows`-row decode step through the paged forward, against what it is made of."""

    rows: int
    context: int
    matrix_products_s: float
    paged_step_s: float
    contiguous_step_s: float
    operators: int

    @property
    def matrix_share(self) -> float:
        """The part of the paged step that its matrix products alone would take."""
        return self.matrix_products_s / self.paged_step_s

    @property
    def paged_over_contiguous(self) -> float:
        return self.paged_step_s / self.contiguous_step_s


def decode_step_cost(model: Llama, rows: int = 32, context: int = 64) -> DecodeStepCost:
    """Time a `rows`-row decode step at `context` earlier positions per row, paged and
    contiguous (`decode_step.time_decode_step`), its matrix products alone, and count the
    operators the paged step dispatches."""
    timing = time_decode_step(model, rows, context)
    paged_step = prepare_decode_steps(model, rows, context).paged
    with torch.inference_mode():
        operators = operator_calls(paged_step)
    return DecodeStepCost(
        rows,
        context,
        matrix_product_seconds(model, rows),
        timing.paged_s,
        timing.contiguous_s,
        operators,
    )


# -- the machine the numbers belong to -----------------------------------------------------


def cpu_model() -> str:
    """The processor's name from /proc/cpuinfo, or what `platform` knows elsewhere."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine_description() -> list[tuple[str, str]]:
    """What wall-clock numbers depend on: processor, cores, threads, load, software versions."""
    import transformers

    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    return [
        ("processor", cpu_model()),
        ("logical CPUs", str(os.cpu_count())),
        ("torch threads", str(torch.get_num_threads())),
        ("load average (1, 5, 15 min)", load),
        ("python", platform.python_version()),
        ("torch", torch.__version__),
        ("transformers", transformers.__version__),
    ]
