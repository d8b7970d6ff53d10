"""The engine: requests, a scheduler and a model runner, one step at a time.

`step()` is one scheduling decision and one forward over every scheduled row: fresh prefills,
resumed prefills (prompt plus the tokens generated before the preemption: resume, not
restart) and decodes, all in the same call. Under a `max_num_batched_tokens` budget a prefill
may be a chunk of its request's positions; only the chunk that reaches a request's last token
is sampled. The engine keeps the requests and the scheduler; the model runner
(`llmengine.runner`) carries each decision out (swaps, the forward, sampling) and is the only
place a forward happens. A request that gets its last token gives its blocks and slot back in
that same step, so a run ends with the step that finishes it. With speculative decoding
(`llmengine.speculative`) a decode row also carries guessed tokens, and the step keeps those
the model agrees with. A constrained request (`llmengine.structured`) samples only what its
grammar allows. The step reports what happened as an `IterationOutcome`, which is all a
benchmark needs to see.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llmengine.engine_config import EngineConfig
from llmengine.model.llama import Llama
from llmengine.outcome import IterationOutcome, PoolShape, StepResult, build_outcome
from llmengine.params import check_logit_bias, check_prompt
from llmengine.runner.model_runner import ModelRunner
from llmengine.sampling import SamplingParams
from llmengine.scheduling.decision import SchedulerOutput
from llmengine.scheduling.request import Request, RequestState
from llmengine.scheduling.scheduler import Scheduler
from llmengine.speculative.speculator import Speculator


class Engine:
    """Continuous batching over a paged KV cache, under one `EngineConfig`.

    `Engine(model, config)` or `Engine(model, num_blocks=..., **fields)`: the configuration's
    fields as keywords (see `EngineConfig` for each: pool, slots, policy, preemption, swap
    space, chunked prefill, prefix caching, compile, decode graph). A bad value is refused
    with ValueError before the cache is allocated.

    Everything a forward touches is the model runner's (`engine.runner`, built when the
    engine is): `compile=True` compiles the position-wise halves of every layer
    (`runner.compile_seconds`); `decode_graph` compiles the decode forward once per batch
    bucket (`runner.graph_compile_seconds`): a step whose rows are all decodes runs the graph
    of the smallest bucket that holds them, any other step runs eager (`runner.graph_steps`
    counts the graph's steps).

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
        self.config = EngineConfig.of(config, options)
        self.scheduler = self.scheduler_class(self.config)
        self.runner = self.runner_for(model, tokenizer)
        # The model's end tokens, given to each request as it is made: its stop rule's.
        self.eos_token_ids = model.config.eos_token_ids
        self.pool = PoolShape.of(self.config, self.runner.cache.bytes_per_block)
        # The guesser of speculative decoding (a no-op without `speculative`).
        self.speculator = Speculator(self.config)
        self.iteration = 0
        self._requests: dict[int, Request] = {}
        self._next_id = 0

    def runner_for(self, model: Llama, tokenizer: Any) -> ModelRunner:
        """The model runner this engine's decisions go to (tensor parallelism's leader
        builds one that broadcasts each forward to the other ranks)."""
        return ModelRunner(model, self.config, tokenizer=tokenizer)

    @property
    def model(self) -> Llama:
        return self.runner.model

    @property
    def tokenizer(self) -> Any:
        """The tokenizer of `generate_text` and of constrained requests (None when none)."""
        return self.runner.tokenizer

    @tokenizer.setter
    def tokenizer(self, tokenizer: Any) -> None:
        self.runner.tokenizer = tokenizer

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
        vocabulary (in the prompt or in `logit_bias`), a worst case (prompt plus max_tokens)
        beyond the empty pool, or a constraint that does not compile or breaks a grammar limit
        (compiled and proved here, once per distinct constraint) raises ValueError and leaves
        the engine as it was.
        """
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be SamplingParams, got {type(params).__name__}")
        prompt = check_prompt(prompt_token_ids, self.model.config.vocab_size)
        check_logit_bias(params, self.model.config.vocab_size)
        if params.constraint is not None:
            self.runner.grammar_compiler.compile(params.constraint)
        request = Request(
            request_id=self._next_id,
            prompt_token_ids=prompt,
            params=params,
            arrival=self._next_id,
            block_size=self.block_size,
            eos_token_ids=self.eos_token_ids,
        )
        self.scheduler.add(request)
        self._next_id += 1
        self._requests[request.request_id] = request
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

    def step(self) -> IterationOutcome:
        """Propose, schedule, run, update: one iteration over every scheduled row.

        A request that gets its last token here gives its blocks and slot back before the
        step returns; one whose row failed (its inputs, its sampling) is aborted. Every step
        is a forward, so stepping an engine with nothing unfinished raises RuntimeError.
        """
        if not self.has_unfinished():
            raise RuntimeError("nothing to step: every request has finished or been aborted")
        self.speculator.propose(self.scheduler.running)
        decision = self.scheduler.schedule()
        result = self._run(decision)
        if result.left_out:  # rows the forward did not compute: none of their K/V exists
            self.scheduler.forward_failed(decision, result.left_out)
        finished = self.scheduler.update(decision, result.tokens)
        for request_id in result.failed:
            self.abort(request_id)
        outcome = build_outcome(self.iteration, decision, finished, result, self.pool)
        self.iteration += 1
        return outcome

    def _run(self, decision: SchedulerOutput) -> StepResult:
        """The runner's share of the step. Should it raise, the blocks the decision offered to
        the prefix cache never got their K/V, and the scheduler forgets them first."""
        try:
            return self.runner.run(decision)
        except BaseException:
            self.scheduler.forward_failed(decision)
            raise

    def check_integrity(self) -> None:
        """The scheduler's invariants: each pool's free plus held is its size, every slot and
        block accounted for. Callable at any time."""
        self.scheduler.check_integrity()

    def close(self) -> None:
        """Stop what outlives a step: the overlap's worker thread in one process
        (`TensorParallelEngine` stops its worker processes too), so callers may close any
        engine alike."""
        self.runner.close()

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
