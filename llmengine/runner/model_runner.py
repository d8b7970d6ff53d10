"""The model runner: the one place a forward happens.

The engine decides (the scheduler's `SchedulerOutput`); the runner carries the decision out
and says what came of it. It owns everything a forward touches: the prepared model, the
paged K/V storage, attention, the compiled layers, the decode graphs, the draft model and
the sampler. `run(decision)` does, in order:

1. let go of the requests the decision says are done, take up the ones it meets first;
2. the decision's swaps (every copy out, then every copy in);
3. the draft model's guesses, in the places the scheduler left for them;
4. the forward: a decode graph when every row decodes one token and a bucket holds them,
   else the eager forward (compiled halves or not), with logits where sampling, prompt
   logprobs and draft checks need them;
5. the sampler, which turns those logits into each request's tokens (`StepResult`).

Under tensor parallelism one runner runs on every rank (`llmengine.parallel.engine`). The
leader (rank 0) drafts and samples, and sends each `ForwardPlan` to the other ranks before it
runs it; every follower's runner `execute`s the same plan on its own slices of the model and
the cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
from llmengine.runner.draft import DraftModel, load_draft
from llmengine.runner.forward import paged_forward
from llmengine.runner.graphs import DecodeGraphs, buckets_for
from llmengine.runner.sampler import Sampler
from llmengine.runner.startup import drop_slower_graphs
from llmengine.scheduling.decision import ScheduledRow, SchedulerOutput, packed_starts
from llmengine.speculative.verify import draft_logits_at
from llmengine.speed.compiled import CompiledLayers
from llmengine.structured.grammar import GrammarCompiler

NO_LOGITS = torch.empty(0)  # the draft logits of a step without drafts


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
        self.graphs: DecodeGraphs | None = None
        self.graph_compile_seconds = 0.0
        self.graph_steps = 0
        if config.decode_graph:
            self._build_graphs(config, measure=leader and self.times_graphs_at_start)
        self.drafter: DraftModel | None = None
        if leader and config.speculative not in (None, "ngram"):
            self.drafter = load_draft(config.speculative, model, self.cache)
        self.sampler = Sampler(model.config, tokenizer, self.device)

    def _build_graphs(self, config: EngineConfig, measure: bool) -> None:
        """One graph per bucket. With `decode_graph=True` the buckets are the slots' and, on
        a CPU in one process, each is timed against eager and dropped where it is not faster
        (`drop_slower_graphs`); buckets named outright are kept as named."""
        wanted = config.decode_graph
        buckets = buckets_for(config.num_slots) if wanted is True else list(wanted)
        self.graphs = DecodeGraphs(self.model, self.cache, config.num_blocks, buckets)
        self.graph_compile_seconds = sum(self.graphs.compile_seconds.values())
        if wanted is True and measure and self.device.type == "cpu":
            drop_slower_graphs(self.graphs, self._eager_decode)

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
        """Carry out `decision` (see the module's docstring) and return what came of it."""
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
        plan, logits_plan, num_drafts = self._plan(decision)
        own = self.execute(plan)
        draft_logits = NO_LOGITS
        if num_drafts:
            own, draft_logits = own[: len(own) - num_drafts], own[len(own) - num_drafts :]
        sampling, scored = own, {}
        if logits_plan is not None:
            sampling, owed = logits_plan.split(own)
            scored = self.sampler.prompt_logprobs.score(logits_plan, owed)
        draft_probs = {} if self.drafter is None else self.drafter.probs
        result = self.sampler.sample(decision.rows, sampling, draft_logits, draft_probs, failed)
        result.prompt_logprobs = scored
        result.forward = plan.path
        return result

    def _plan(self, decision: SchedulerOutput) -> tuple[ForwardPlan, LogitsPlan | None, int]:
        """The forward's plan, the prompt logprobs' share of its logits (None: no row owes
        any) and how many of its logits check drafts (the last ones)."""
        scheduled = decision.rows
        rows = [paged_row(row) for row in scheduled]
        swaps = (decision.blocks_to_swap_out, decision.blocks_to_swap_in)
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

    def execute(self, plan: ForwardPlan) -> torch.Tensor:
        """Run one plan on this rank: swaps, then the forward; the logits it asks for."""
        self.cache.swap(plan.blocks_to_swap_out, plan.blocks_to_swap_in)
        if plan.bucket is not None:
            assert self.graphs is not None
            self.graph_steps += 1
            return self.graphs(plan.rows, plan.bucket)
        return paged_forward(
            self.model, self.cache, plan.rows, self.compiled_layers, plan.logits_at
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
