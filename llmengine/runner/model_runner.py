"""The model runner: the one place a forward happens.

The engine decides (the scheduler's `SchedulerOutput`); the runner carries the decision out
and says what came of it. It owns everything a forward touches: the prepared model, the
paged K/V storage, attention, the compiled layers, the decode graphs, the draft model and
the sampler. `run(decision)` does, in order:

1. let go of the requests the decision says are done, take up the ones it meets first;
2. the draft model's guesses, in the places the scheduler left for them;
3. the forward's inputs, prepared from every row (token ids, positions, write slots, block
   tables) before anything runs (`StepPreparer`, in `llmengine.runner.prepare`); with
   `overlap` all but the token ids may have been built during the last forward, on a worker
   thread, when its guess of this step's rows was right (`llmengine.runner.overlap`);
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
from typing import Any

import torch

from llmengine.engine_config import EngineConfig
from llmengine.kv.paged_cache import PagedKVCache
from llmengine.model.llama import Llama
from llmengine.outcome import StepResult
from llmengine.runner.attention import PagedRow
from llmengine.runner.cuda_graphs import StaticDecodeGraphs
from llmengine.runner.draft import DraftModel, load_draft
from llmengine.runner.forward import paged_forward
from llmengine.runner.graphs import DecodeGraphs, buckets_for
from llmengine.runner.overlap import OverlappedPreparer
from llmengine.runner.prepare import ForwardPlan, Inputs, StepPreparer
from llmengine.runner.sampler import Sampler
from llmengine.runner.startup import drop_slower_graphs, graph_report
from llmengine.scheduling.decision import SchedulerOutput
from llmengine.speed.compiled import CompiledLayers
from llmengine.structured.grammar import GrammarCompiler

NO_LOGITS = torch.empty(0)  # the draft logits of a step without drafts

logger = logging.getLogger("llmengine.runner")


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
        self.overlap = OverlappedPreparer(self.cache) if config.overlap else None
        self.preparer = StepPreparer(
            self.cache, self.graphs, self.sampler.prompt_logprobs, self.overlap
        )

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
        preparing its inputs (`StepPreparer.rows_that_prepare`), whose row the forward then
        leaves out (`StepResult.left_out`), scoring its prompt or sampling; a draft proposal
        that raises costs its row the drafts only (`DraftModel.propose`). Only the forward's
        own faults, of no known owner, raise."""
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
            prepared = self.preparer.prepare(rows, decision)
        except Exception:  # some row's data, or none's: preparing them one by one tells which
            rows, left_out = self.preparer.rows_that_prepare(decision, failed)
            prepared = self.preparer.prepare(rows, decision)
        plan, inputs, logits_plan, num_drafts = prepared
        started = time.perf_counter()
        if self.overlap is None:
            own = self.execute(plan, inputs)
        else:  # the next step's inputs guessed on a worker thread during this forward
            self.overlap.guess_during(plan)
            own = self.execute(plan, inputs)
            self.overlap.forward_done()
        draft_logits = NO_LOGITS
        if num_drafts:
            own, draft_logits = own[: len(own) - num_drafts], own[len(own) - num_drafts :]
        sampling, scored = own, {}
        if logits_plan is not None:
            sampling, owed = logits_plan.split(own)
            scored = self.sampler.prompt_logprobs.score(logits_plan, owed, failed)
        draft_probs = {} if self.drafter is None else self.drafter.probs
        picks = None if plan.bucket is None or self.graphs is None else self.graphs.greedy_picks
        result = self.sampler.sample(rows, sampling, draft_logits, draft_probs, failed, picks)
        result.prompt_logprobs = scored
        result.forward = plan.path
        result.forward_seconds = time.perf_counter() - started
        result.left_out = left_out
        return result

    def close(self) -> None:
        """Stop the overlap's worker thread, if there is one."""
        if self.overlap is not None:
            self.overlap.close()

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
