"""The model runner: the one place a forward happens.

The engine decides (the scheduler's `SchedulerOutput`); the runner carries the decision out
and says what came of it. It owns everything a forward touches: the prepared model, the
paged K/V storage, attention, the compiled layers, the decode graphs, the draft model and
the sampler. `run(decision)` does, in order:

1. let go of the requests the decision says are done, take up the ones it meets first;
2. the draft model's guesses, in the places the scheduler left for them;
3. the forward's inputs, prepared from every row (token ids, positions, write slots, block
   tables) before anything runs;
4. the decision's swaps (every copy out, then every copy in), then the forward: a decode
   graph when every row decodes one token and a bucket holds them (on CUDA a captured CUDA
   graph over persistent input buffers, on a CPU a compiled forward), else the eager forward
   (compiled halves or not), with logits where sampling, prompt logprobs and draft checks
   need them;
5. the sampler, which turns those logits into each request's tokens (`StepResult`).

A fault traced to one row fails that row's request alone, the others get exactly what they
would have had: a request whose state cannot be taken up, or whose inputs cannot be
prepared (the forward then runs without its row, `StepResult.left_out`), or whose prompt's
scoring (`PromptLogprobs.score`) or sampling (`Sampler`) fails; a draft proposal that
raises costs its row its drafts only. Finding the row costs nothing while nothing fails:
the rows are prepared together, and one by one only after that raised. A fault of the
forward itself has no known owner and raises.

Under tensor parallelism one runner runs on every rank (`llmengine.parallel.engine`). The
leader (rank 0) drafts and samples, and sends each `ForwardPlan` to the other ranks before it
runs it; every follower's runner `execute`s the same plan on its own slices of the model and
the cache.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from llmengine.engine_config import EngineConfig
from llmengine.kv.paged_cache import PagedKVCache
from llmengine.model.llama import Llama
from llmengine.outcome import (
    DECODE_GRAPH,
    EAGER,
    EAGER_DRAFTS,
    EAGER_NO_BUCKET,
    EAGER_PREFILL,
    StepResult,
)
from llmengine.prompt_logprobs import LogitsPlan
from llmengine.runner.attention import PagedRow
from llmengine.runner.cuda_graphs import StaticDecodeGraphs
from llmengine.runner.draft import DraftModel, load_draft
from llmengine.runner.forward import PackedInputs, packed_inputs, paged_forward
from llmengine.runner.graphs import DecodeGraphs, buckets_for
from llmengine.runner.paged_flex import DecodeInputs
from llmengine.runner.sampler import Sampler
from llmengine.runner.startup import drop_slower_graphs, graph_report
from llmengine.runner.step_buffers import StepBuffers
from llmengine.scheduling.decision import (
    ScheduledRow,
    SchedulerOutput,
    packed_starts,
    readers_of_left_out,
)
from llmengine.speculative.verify import draft_logits_at
from llmengine.speed.compiled import CompiledLayers
from llmengine.structured.grammar import GrammarCompiler

NO_LOGITS = torch.empty(0)  # the draft logits of a step without drafts

# A plan's inputs: the eager forward's, the compiled graph's, or the captured graph's buffers.
Inputs = PackedInputs | DecodeInputs | StepBuffers

logger = logging.getLogger("llmengine.runner")


@dataclass(frozen=True, slots=True)
class ForwardPlan:
    """One forward, as every rank runs it: the rows, the swaps before it, the decode graph's
    bucket (None: eager), and the packed positions whose logits are wanted (None: each
    row's last)."""

    rows: list[PagedRow]
    blocks_to_swap_out: list[tuple[int, int]]
    blocks_to_swap_in: list[tuple[int, int]]
    bucket: int | None = None
    logits_at: list[int] | None = None
    path: str = EAGER


class Prepared(NamedTuple):
    """A step's forward, ready to run: its plan, its inputs (None: no row to compute), the
    prompt logprobs' share of its logits and how many of them check drafts (the last)."""

    plan: ForwardPlan
    inputs: Inputs | None
    logits_plan: LogitsPlan | None
    num_drafts: int


class ModelRunner:
    """Runs `model` under `config`: `run(decision) -> StepResult`.

    `compile_seconds` and `graph_compile_seconds` are what start-up spent compiling (0 when
    off); `graph_steps` counts the steps the decode graph ran. `leader=False` makes a
    follower rank's runner (no draft model: it only `execute`s plans).
    """

    # With `decode_graph=True`, time each bucket's graph against eager at start and drop the
    # slower ones (on a CPU; a GPU's asynchronous launches make such timings meaningless).
    times_graphs_at_start = True

    def __init__(
        self,
        model: Llama,
        config: EngineConfig,
        *,
        tokenizer: Any = None,
        leader: bool = True,
    ) -> None:
        self.model = model
        self.cache = paged_cache_for(model, config)
        self.compiled_layers: CompiledLayers | None = None
        self.compile_seconds = 0.0
        if config.compile:
            self.compiled_layers = CompiledLayers()
            self.compile_seconds = self.compiled_layers.warm_up(model)
        self.graphs: DecodeGraphs | StaticDecodeGraphs | None = None
        self.graph_compile_seconds = 0.0
        self.graph_steps = 0
        if config.decode_graph:
            self._build_graphs(config, measure=leader and self.times_graphs_at_start)
        self.drafter: DraftModel | None = None
        if leader and config.speculative not in (None, "ngram"):
            self.drafter = load_draft(config.speculative, model, self.cache)
        self.sampler = Sampler(model.config, tokenizer, self.device)

    def _build_graphs(self, config: EngineConfig, measure: bool) -> None:
        """One graph per bucket (`decode_graphs_class`). With `decode_graph=True` the
        buckets are the slots' and, on a CPU in one process, each is timed against eager and
        dropped where it is not faster (`drop_slower_graphs`); buckets named outright are
        kept as named. What start-up measured is logged (`graph_report`)."""
        wanted = config.decode_graph
        buckets = buckets_for(config.num_slots) if wanted is True else list(wanted)
        graphs_class = self.decode_graphs_class()
        self.graphs = graphs_class(self.model, self.cache, config.num_blocks, buckets)
        self.graph_compile_seconds = sum(self.graphs.compile_seconds.values())
        if wanted is True and measure and self.device.type == "cpu":
            drop_slower_graphs(self.graphs, self._eager_decode)
        logger.info("%s", graph_report(self.graphs))

    def decode_graphs_class(self) -> type[DecodeGraphs] | type[StaticDecodeGraphs]:
        """On CUDA the decode step captured as CUDA graphs over persistent buffers; on a CPU
        the decode forward compiled by inductor with flex attention."""
        return StaticDecodeGraphs if self.device.type == "cuda" else DecodeGraphs

    def _eager_decode(self, rows: list[PagedRow]) -> torch.Tensor:
        return paged_forward(self.model, self.cache, rows, self.compiled_layers)

    @property
    def device(self) -> torch.device:
        return self.cache.device

    @property
    def grammar_compiler(self) -> GrammarCompiler:
        """The compiler of this runner's constraints against its tokenizer; safe to call from
        any thread, and ValueError when the runner has no tokenizer."""
        return self.sampler.grammars.compiler

    @property
    def tokenizer(self) -> Any:
        return self.sampler.grammars.tokenizer

    @tokenizer.setter
    def tokenizer(self, tokenizer: Any) -> None:
        self.sampler.grammars.tokenizer = tokenizer

    # -- one step ---------------------------------------------------------------------------

    @torch.inference_mode()
    def run(self, decision: SchedulerOutput) -> StepResult:
        """Carry out `decision` (see the module's docstring) and return what came of it.

        A fault traced to one row fails that row's request alone: taking its state up,
        preparing its inputs (`_rows_that_prepare`), whose row the forward then leaves out
        (`StepResult.left_out`), scoring its prompt or sampling; a draft proposal that
        raises costs its row the drafts only (`DraftModel.propose`). Only the forward's own
        faults, of no known owner, raise."""
        for request_id in decision.finished_request_ids:
            self.sampler.forget(request_id)
            if self.drafter is not None:
                self.drafter.forget(request_id)
        if not decision.rows:
            return StepResult()  # a decision with nothing to compute only lets go
        failed: dict[int, str] = {}
        for row in decision.rows:
            try:
                self.sampler.take_up(row.request)
            except Exception as error:  # its grammar's matcher, say: its row computes, unsampled
                failed[row.request.request_id] = f"taking the request up failed: {error}"
        if self.drafter is not None:
            self.drafter.cache.swap(decision.blocks_to_swap_out, decision.blocks_to_swap_in)
            self.drafter.propose(decision.rows, self.sampler.generators)
        rows, left_out = decision.rows, []
        try:
            prepared = self._prepare(rows, decision)
        except Exception:  # some row's data, or none's: preparing them one by one tells which
            rows, left_out = self._rows_that_prepare(decision, failed)
            prepared = self._prepare(rows, decision)
        plan, inputs, logits_plan, num_drafts = prepared
        started = time.perf_counter()
        own = self.execute(plan, inputs)
        draft_logits = NO_LOGITS
        if num_drafts:
            own, draft_logits = own[: len(own) - num_drafts], own[len(own) - num_drafts :]
        sampling, scored = own, {}
        if logits_plan is not None:
            sampling, owed = logits_plan.split(own)
            scored = self.sampler.prompt_logprobs.score(logits_plan, owed, failed)
        draft_probs = {} if self.drafter is None else self.drafter.probs
        result = self.sampler.sample(rows, sampling, draft_logits, draft_probs, failed)
        result.prompt_logprobs = scored
        result.forward = plan.path
        result.forward_seconds = time.perf_counter() - started
        result.left_out = left_out
        return result

    def _prepare(self, rows: list[ScheduledRow], decision: SchedulerOutput) -> Prepared:
        """The forward's plan for `rows`, and its inputs (`packed_inputs` or the decode
        graph's), built before anything runs: a fault here is one of the rows' data."""
        plan, logits_plan, num_drafts = self._plan(rows, decision)
        if not plan.rows:
            return Prepared(plan, None, logits_plan, num_drafts)
        if plan.bucket is not None:
            assert self.graphs is not None
            inputs = self.graphs.inputs_for(plan.rows, plan.bucket)
            return Prepared(plan, inputs, logits_plan, num_drafts)
        return Prepared(plan, packed_inputs(self.cache, plan.rows), logits_plan, num_drafts)

    def _rows_that_prepare(
        self, decision: SchedulerOutput, failed: dict[int, str]
    ) -> tuple[list[ScheduledRow], list[int]]:
        """The rows whose inputs prepare, each prepared alone, and the requests the forward
        leaves out: those whose row raises (failed with why), and those whose row would read
        K/V a left-out row was to write, a prefix-cache hit in the same decision (failed
        too: their K/V would be garbage)."""
        left_out: dict[int, str] = {}
        for row in decision.rows:
            try:
                self._prepare([row], decision)
            except Exception as error:
                left_out[row.request.request_id] = f"preparing its inputs failed: {error}"
        readers = readers_of_left_out(decision, left_out, self.cache.block_size)
        for request_id, owner in readers.items():
            left_out[request_id] = (
                f"its cached prefix was to be computed by request {owner}, whose inputs failed"
            )
        for request_id, reason in left_out.items():
            failed.setdefault(request_id, reason)
        rows = [row for row in decision.rows if row.request.request_id not in left_out]
        return rows, list(left_out)

    def _plan(
        self, scheduled: list[ScheduledRow], decision: SchedulerOutput
    ) -> tuple[ForwardPlan, LogitsPlan | None, int]:
        """The forward's plan for the `scheduled` rows of `decision` (its swaps), the prompt
        logprobs' share of its logits (None: no row owes any) and how many of its logits
        check drafts (the last ones)."""
        rows = [paged_row(row) for row in scheduled]
        swaps = (decision.blocks_to_swap_out, decision.blocks_to_swap_in)
        if not rows:
            return ForwardPlan(rows, *swaps), None, 0
        bucket, path = self._route(scheduled)
        if bucket is not None:
            return ForwardPlan(rows, *swaps, bucket=bucket, path=path), None, 0
        logits_plan = self.sampler.prompt_logprobs.plan(scheduled)
        drafts_at = draft_logits_at(scheduled)
        if logits_plan is None and not drafts_at:
            return ForwardPlan(rows, *swaps, path=path), None, 0
        last_positions = [end - 1 for end in packed_starts(scheduled)[1:]]
        logits_at = last_positions if logits_plan is None else logits_plan.logits_at
        plan = ForwardPlan(rows, *swaps, logits_at=logits_at + drafts_at, path=path)
        return plan, logits_plan, len(drafts_at)

    def _route(self, rows: list[ScheduledRow]) -> tuple[int | None, str]:
        """The decode graph's bucket for these rows and `DECODE_GRAPH`, or None and why the
        step runs eager: no graphs, a prefill or chunk among the rows, a row with drafts, or
        no kept bucket that holds them all."""
        if self.graphs is None:
            return None, EAGER
        if any(row.is_prefill for row in rows):
            return None, EAGER_PREFILL
        if any(row.num_positions != 1 for row in rows):
            return None, EAGER_DRAFTS
        bucket = self.graphs.graph_for(len(rows))
        return bucket, DECODE_GRAPH if bucket is not None else EAGER_NO_BUCKET

    def execute(self, plan: ForwardPlan, inputs: Inputs | None = None) -> torch.Tensor:
        """Run one plan on this rank: swaps, then the forward; the logits it asks for.
        `inputs` are the plan's prepared inputs (None: built here, as a follower does); a
        plan without rows (every row's inputs failed) only swaps."""
        self.cache.swap(plan.blocks_to_swap_out, plan.blocks_to_swap_in)
        if not plan.rows:
            return NO_LOGITS
        if plan.bucket is not None:
            assert self.graphs is not None
            self.graph_steps += 1
            return self.graphs(plan.rows, plan.bucket, inputs)  # type: ignore[arg-type]
        return paged_forward(
            self.model, self.cache, plan.rows, self.compiled_layers, plan.logits_at, inputs
        )


def paged_cache_for(model: Llama, config: EngineConfig) -> PagedKVCache:
    """The paged cache a runner under `config` runs `model` on, on the model's device and in
    its dtype. The decode graphs pad a batch up to its bucket; the padding rows write their
    K/V into one extra block beyond the pool, which the scheduler never hands out."""
    parameter = next(model.parameters())
    return PagedKVCache(
        model.config,
        config.num_blocks + 1 if config.decode_graph else config.num_blocks,
        config.block_size,
        dtype=parameter.dtype,
        device=parameter.device,
        swap_blocks=config.swap_blocks,
    )


def paged_row(row: ScheduledRow) -> PagedRow:
    """A scheduled row as the paged forward takes it: new tokens, where they start, its blocks."""
    return PagedRow(row.token_ids, row.start_position, row.request.block_table.block_ids)
