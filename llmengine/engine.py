"""The engine: a scheduler, a paged KV cache and a model, one step at a time.

`step()` is one scheduling decision and one forward over every scheduled row: fresh prefills,
resumed prefills (prompt plus the tokens generated before the preemption: resume, not
restart) and decodes, all in the same call. Under a `max_num_batched_tokens` budget a prefill
may be a chunk of its request's positions; only the chunk that reaches a request's last token
is sampled. Before the forward the cache carries out the decision's swaps. A request that gets
its last token gives its blocks and slot back in that same step, so a run ends with the step
that finishes it. With speculative decoding (`llmengine.speculative`) a decode row also
carries guessed tokens, and the step keeps those the model agrees with. A constrained request
(`llmengine.structured`) samples only what its grammar allows. The step reports what happened
as an `IterationOutcome`, which is all a benchmark needs to see.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from llmengine.engine_config import EngineConfig
from llmengine.kv.paged_cache import PagedKVCache, PagedRow, paged_forward
from llmengine.model.llama import Llama
from llmengine.outcome import IterationOutcome, TokenLogprobs, build_outcome
from llmengine.params import check_prompt
from llmengine.prompt_logprobs import PromptLogprobs
from llmengine.sampling import SamplingParams, make_generator, sample_rows
from llmengine.scheduling.decision import ScheduledRow, SchedulerOutput, packed_starts
from llmengine.scheduling.request import Request, RequestState
from llmengine.scheduling.scheduler import Scheduler
from llmengine.speculative.speculator import Speculator
from llmengine.speculative.verify import draft_logits_at, verify_rows
from llmengine.speed.compiled import CompiledLayers
from llmengine.speed.decode_graph import DecodeGraphs, buckets_for
from llmengine.structured.matchers import RequestGrammars

# What a forward gives the sampler: each row's logits at its last new position, the prompt
# logprobs the prefill rows owe, and the logits that check the rows' drafts.
StepLogits = tuple[torch.Tensor, dict[int, list[TokenLogprobs]], torch.Tensor]
NO_LOGITS = torch.empty(0)


class Engine:
    """Continuous batching over a paged KV cache, under one `EngineConfig`.

    `Engine(model, config)` or `Engine(model, num_blocks=..., **fields)`: the configuration's
    fields as keywords (see `EngineConfig` for each: pool, slots, policy, preemption, swap
    space, chunked prefill, prefix caching, compile, decode graph). A bad value is refused
    with ValueError before the cache is allocated.

    `compile=True` compiles the position-wise halves of every layer when the engine is built
    (`compile_seconds`); `decode_graph` compiles the decode forward once per batch bucket
    (`graph_compile_seconds`): a step whose rows are all decodes runs the graph of the
    smallest bucket that holds them, any other step runs eager, as does a bucket whose graph
    was not faster than eager when it was built (`graph_steps` counts the graph's steps).

    `scheduler_class` is the scheduler the engine builds; a subclass that overrides a
    scheduler rule (a lesson's deliberately wrong resume, say) runs on the real model.
    """

    scheduler_class: type[Scheduler] = Scheduler

    def __init__(
        self,
        model: Llama,
        config: EngineConfig | None = None,
        /,
        *,
        tokenizer: Any = None,
        **options: Any,
    ) -> None:
        self.config = config = EngineConfig.of(config, options)
        self.model = model
        # Compiled halves of every layer (llmengine.speed.compiled), compiled here rather than on
        # the first requests; compile_seconds says what that cost.
        self.compiled_layers: CompiledLayers | None = None
        self.compile_seconds = 0.0
        if config.compile:
            self.compiled_layers = CompiledLayers()
            self.compile_seconds = self.compiled_layers.warm_up(model)
        self.scheduler = self.scheduler_class(config)
        self.cache = paged_cache_for(model, config)
        self.decode_graphs: DecodeGraphs | None = None
        self.graph_compile_seconds = 0.0
        self.graph_steps = 0
        if config.decode_graph:
            buckets = (
                buckets_for(config.num_slots)
                if config.decode_graph is True
                else list(config.decode_graph)
            )
            self.decode_graphs = DecodeGraphs(model, self.cache, config.num_blocks, buckets)
            self.graph_compile_seconds = sum(self.decode_graphs.compile_seconds.values())
        # The guesser of speculative decoding (a no-op without `speculative`).
        self.speculator = Speculator(config, model, self.cache)
        self.eos_token_ids = model.config.eos_token_ids
        self.iteration = 0
        self._requests: dict[int, Request] = {}
        self._generators: dict[int, torch.Generator | None] = {}
        self.prompt_logprobs = PromptLogprobs()
        # Matchers of the constrained requests (SamplingParams.constraint), through the
        # tokenizer: a grammar is over text, the mask over token ids.
        self.grammars = RequestGrammars(tokenizer, model.config.vocab_size, self.eos_token_ids)
        self._next_id = 0

    @property
    def tokenizer(self) -> Any:
        """The tokenizer of `generate_text` and of constrained requests (None when none)."""
        return self.grammars.tokenizer

    @tokenizer.setter
    def tokenizer(self, tokenizer: Any) -> None:
        self.grammars.tokenizer = tokenizer

    # -- the pool, as callers see it -----------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return self.config.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.scheduler.blocks.num_free

    @property
    def num_swap_blocks(self) -> int:
        return self.config.swap_blocks

    @property
    def num_free_swap_blocks(self) -> int:
        return self.scheduler.swap.num_free

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def num_slots(self) -> int:
        return self.config.num_slots

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    @property
    def num_running(self) -> int:
        """Requests holding a slot (prefilling or decoding)."""
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        """Requests queued for a slot: never admitted yet, or preempted by recompute."""
        return len(self.scheduler.waiting)

    @property
    def num_swapped(self) -> int:
        """Requests whose K/V waits in host memory for a slot."""
        return len(self.scheduler.swapped)

    def request(self, request_id: int) -> Request:
        """The engine's record of a request (prompt, output, state, preemptions)."""
        if request_id not in self._requests:
            raise KeyError(f"no request {request_id} in this engine")
        return self._requests[request_id]

    # -- requests in -----------------------------------------------------------------------

    def add_request(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> int:
        """Queue a prompt; returns its request id.

        Everything is checked before anything changes: an empty prompt, a token id outside the
        vocabulary, a worst case (prompt plus max_tokens) beyond the empty pool, or a
        constraint that does not compile (compiled here, once per distinct constraint) raises
        ValueError and leaves the engine as it was.
        """
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be SamplingParams, got {type(params).__name__}")
        prompt = check_prompt(prompt_token_ids, self.model.config.vocab_size)
        self.grammars.check(params)
        request = Request(
            request_id=self._next_id,
            prompt_token_ids=prompt,
            params=params,
            arrival=self._next_id,
            block_size=self.block_size,
        )
        self.scheduler.add(request)
        self._next_id += 1
        self._requests[request.request_id] = request
        # On the cache's device: a CUDA row cannot draw from a CPU generator.
        self._generators[request.request_id] = make_generator(params, self.cache.device)
        self.prompt_logprobs.add(request)
        self.grammars.add(request.request_id, params)
        return request.request_id

    def add_requests(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams],
    ) -> list[int]:
        """Queue several prompts, all or none; their request ids in the order of `prompts`.

        `params` is one for all or one per prompt. If any prompt is refused (ValueError, as
        `add_request`), those already queued are aborted and released before it propagates,
        so the engine is left as it was.
        """
        per_prompt = [params] * len(prompts) if isinstance(params, SamplingParams) else params
        if len(per_prompt) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(per_prompt)} sampling params")
        ids: list[int] = []
        try:
            for prompt, prompt_params in zip(prompts, per_prompt, strict=True):
                ids.append(self.add_request(prompt, prompt_params))
        except ValueError:
            for request_id in ids:
                self.abort(request_id)
                self.release(request_id)
            raise
        return ids

    def abort(self, request_id: int) -> bool:
        """Stop a waiting, running, preempted or swapped request; what it holds goes back now.

        True when it stopped something. False when the request had already finished: a server
        races a client's disconnect against the last token, and losing that race is no error.
        KeyError for an id this engine never issued; ValueError for one already aborted.
        """
        if request_id not in self._requests:
            if 0 <= request_id < self._next_id:
                return False  # finished, and its record handed back by release()
            raise KeyError(f"no request {request_id} in this engine")
        request = self._requests[request_id]
        if request.state == RequestState.FINISHED:
            return False
        if request.state == RequestState.ABORTED:
            raise ValueError(f"request {request_id} is already aborted")
        self.scheduler.abort(request)
        self._forget([request_id])
        return True

    def release(self, request_id: int) -> Request:
        """Hand back the record of a finished or aborted request, and forget it.

        The engine keeps every request's record until someone takes it, so a caller that adds
        requests for ever (a server) must take each one once it is done, or the records pile
        up. ValueError while the request is still unfinished; KeyError for an id this engine
        does not hold (never issued, or already released).
        """
        request = self.request(request_id)
        if request.state not in (RequestState.FINISHED, RequestState.ABORTED):
            raise ValueError(f"request {request_id} is still {request.state.value}")
        return self._requests.pop(request_id)

    # -- one iteration -------------------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> IterationOutcome:
        """Schedule, forward, sample, update: one iteration over every scheduled row.

        A request that gets its last token here gives its blocks and slot back before the
        step returns. Every step is a forward, so stepping an engine with nothing unfinished
        raises RuntimeError.
        """
        if not self.has_unfinished():
            raise RuntimeError("nothing to step: every request has finished or been aborted")
        self.speculator.propose(self.scheduler.running)
        decision = self.scheduler.schedule()
        logits, prompt_logprobs, draft_logits = self._carry_out(decision)
        sampled = sample_rows(decision.rows, logits, self._generators, self.grammars)
        verify_rows(
            decision.rows, logits, draft_logits, self._generators, self.eos_token_ids, sampled,
            self.speculator.draft_probs,
        )  # fmt: skip
        finished = self.scheduler.update(decision, sampled.tokens, self.eos_token_ids)
        self._forget(request.request_id for request in finished)
        for request_id in sampled.failed:
            self.abort(request_id)
        outcome = build_outcome(
            self.iteration, decision, finished, sampled, prompt_logprobs,
            config=self.config, bytes_per_block=self.cache.bytes_per_block,
        )  # fmt: skip
        self.iteration += 1
        return outcome

    def _carry_out(self, decision: SchedulerOutput) -> StepLogits:
        """The decision on the cache and the model: its swaps (out, then in), the draft
        model's guesses, then the forward."""
        self.cache.swap(decision.blocks_to_swap_out, decision.blocks_to_swap_in)
        self.speculator.before_forward(decision, self._generators)
        return self._forward(decision.rows)

    def _forward(self, scheduled: list[ScheduledRow]) -> StepLogits:
        """The rows' sampling logits, through the decode graph when a bucket holds them; the
        prompt logprobs the prefill rows owe (which need logits at every position); and the
        logits that check the rows' drafts (`llmengine.speculative.verify`)."""
        rows = [paged_row(row) for row in scheduled]
        bucket = self._decode_bucket(scheduled)
        if bucket is not None:
            assert self.decode_graphs is not None
            self.graph_steps += 1
            return self.decode_graphs(rows, bucket), {}, NO_LOGITS
        plan = self.prompt_logprobs.plan(scheduled)
        drafts_at = draft_logits_at(scheduled)
        if plan is None and not drafts_at:
            return paged_forward(self.model, self.cache, rows, self.compiled_layers), {}, NO_LOGITS
        last_positions = [end - 1 for end in packed_starts(scheduled)[1:]]
        logits_at = plan.logits_at if plan is not None else last_positions
        logits = paged_forward(
            self.model, self.cache, rows, self.compiled_layers, logits_at + drafts_at
        )
        own, draft_logits = logits[: len(logits_at)], logits[len(logits_at) :]
        if plan is None:
            return own, {}, draft_logits
        sampling, owed = plan.split(own)
        return sampling, self.prompt_logprobs.score(plan, owed), draft_logits

    def _decode_bucket(self, rows: list[ScheduledRow]) -> int | None:
        """The decode graph's bucket for these rows, or None when the step runs eager: no
        graphs, a prefill or chunk among the rows, or no kept bucket holds them all."""
        if self.decode_graphs is None or any(
            row.is_prefill or len(row.token_ids) != 1 for row in rows
        ):
            return None
        return self.decode_graphs.graph_for(len(rows))

    def _forget(self, request_ids: Iterable[int]) -> None:
        """Drop what the engine kept to sample for requests that are done."""
        for request_id in request_ids:
            del self._generators[request_id]
            self.prompt_logprobs.forget(request_id)
            self.grammars.forget(request_id)
            self.speculator.forget(request_id)

    def check_integrity(self) -> None:
        """The scheduler's invariants: each pool's free plus held is its size, every slot and
        block accounted for. Callable at any time."""
        self.scheduler.check_integrity()

    def close(self) -> None:
        """Stop what outlives a step: nothing in one process (`TensorParallelEngine` stops its
        worker processes), so callers may close any engine alike."""

    # -- run to completion ---------------------------------------------------------------

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams],
    ) -> list[list[int]]:
        """Run `prompts` to completion; generated token ids in the order of `prompts`."""
        ids = self.add_requests(prompts, params)
        while self.has_unfinished():
            self.step()
        return [self.release(request_id).output_token_ids for request_id in ids]

    def generate_text(self, prompts: Sequence[str], params: SamplingParams) -> list[str]:
        """`generate` on strings, through the engine's tokenizer."""
        if self.tokenizer is None:
            raise ValueError("this engine has no tokenizer: pass tokenizer= to Engine")
        encoded = [self.tokenizer.encode(prompt) for prompt in prompts]
        outputs = self.generate(encoded, params)
        return [self.tokenizer.decode(tokens, skip_special_tokens=True) for tokens in outputs]


def paged_cache_for(model: Llama, config: EngineConfig) -> PagedKVCache:
    """The paged cache an engine under `config` runs `model` on, on the model's device and in
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
