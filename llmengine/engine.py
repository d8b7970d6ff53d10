"""The engine: a scheduler, a paged KV cache and a model, one step at a time.

`step()` is one scheduling decision and one forward over every scheduled row: fresh prefills,
resumed prefills (prompt plus the tokens generated before the preemption: resume, not
restart) and decodes, all in the same call. Under a `max_num_batched_tokens` budget a prefill
may be a chunk of its request's positions; only the chunk that reaches a request's last
token is sampled. Before the forward it carries out the decision's
swaps: every block copied out to host memory, then every block copied back in. A request that
gets its last token gives its blocks and slot back in that same step, so a run ends with the
step that finishes it. The step reports what happened as an `IterationOutcome`, which is all a
benchmark needs to see.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from llmengine.blocks import blocks_for_length
from llmengine.compiled import compiled_layer_steps, warm_up
from llmengine.decode_graph import DecodeGraphs, buckets_for
from llmengine.model import LayerSteps, Llama
from llmengine.outcome import IterationOutcome, TokenLogprobs
from llmengine.paged_cache import PagedKVCache, PagedRow, paged_forward
from llmengine.prompt_logprobs import PromptLogprobs
from llmengine.request import Request, RequestState
from llmengine.sampling import SamplingParams, make_generator, sample_tokens, token_logprobs
from llmengine.scheduler import ScheduledRow, Scheduler, SchedulerOutput


class Engine:
    """Continuous batching over a paged KV cache.

    `num_blocks` KV blocks of `block_size` tokens form the pool; at most `num_slots` requests
    run in one forward. `policy="reserve"` admits a request only when the pool can hold its
    worst case (lesson 12); `policy="incremental"` buys blocks a step at a time and preempts
    the youngest running request when the pool runs dry (lesson 13). Any other policy is
    refused with ValueError here, before the cache is allocated.

    `preemption="recompute"` throws a victim's K/V away and recomputes it when the victim
    resumes; `preemption="swap"` copies it to a host swap space of `swap_blocks` blocks and
    back (lesson 18), falling back to recompute when the swap space cannot hold the victim.
    `swap_blocks` must be 0 under recompute; under swap, 0 means every victim falls back.

    `max_num_batched_tokens` (None: no cap) caps the positions one forward computes, at least
    `num_slots` of them: decodes first, then prefill chunks in queue order, so a long prompt
    is prefilled over several steps without stalling the decodes (chunked prefill). Only rows
    that complete a prefill or decode are sampled, so a seeded generator draws the same
    numbers in the same order whatever the cap, and the text does not depend on it.

    `enable_prefix_caching=True` shares full KV blocks between requests whose tokens agree up
    to the end of the block (lesson 21): a request takes the cached blocks of its prefix
    instead of computing them, and `IterationOutcome.cached_tokens` says how many positions.

    `compile=True` runs the position-wise halves of every layer through `torch.compile`
    (`llmengine.compiled`), compiled once when the engine is built (`compile_seconds`);
    attention and everything else stay as they are. The default keeps the eager forward.

    `decode_graph=True` compiles the whole decode forward once per batch bucket
    (`llmengine.decode_graph`: 1, 2, 4, ... up to `num_slots`; a sequence of ints names the
    buckets) when the engine is built (`graph_compile_seconds`). A step whose rows are all
    one-token decodes runs the graph of the smallest bucket that holds them, padded; any
    other step (prefills, chunks, mixed) runs eager, as does a bucket whose graph was not
    faster than eager when it was built. `graph_steps` counts the steps that used a graph.

    `scheduler_class` is the scheduler the engine builds; a subclass that overrides a
    scheduler rule (a lesson's deliberately wrong resume, say) runs on the real model.
    """

    scheduler_class: type[Scheduler] = Scheduler

    def __init__(
        self,
        model: Llama,
        *,
        num_blocks: int,
        block_size: int = 16,
        num_slots: int = 8,
        policy: str = "incremental",
        watermark: int = 0,
        preemption: str = "recompute",
        swap_blocks: int = 0,
        max_num_batched_tokens: int | None = None,
        enable_prefix_caching: bool = False,
        compile: bool = False,
        decode_graph: bool | Sequence[int] = False,
        tokenizer: Any = None,
    ) -> None:
        self.model = model
        # Compiled halves of every layer (llmengine.compiled), compiled here rather than on
        # the first requests; compile_seconds says what that cost.
        self.layer_steps: LayerSteps | None = None
        self.compile_seconds = 0.0
        if compile:
            self.layer_steps = compiled_layer_steps()
            self.compile_seconds = warm_up(model, self.layer_steps)
        self.tokenizer = tokenizer
        self.scheduler = self.scheduler_class(
            num_blocks,
            block_size,
            num_slots,
            policy,
            watermark,
            preemption=preemption,
            swap_blocks=swap_blocks,
            max_num_batched_tokens=max_num_batched_tokens,
            enable_prefix_caching=enable_prefix_caching,
        )
        self.scheduler.on_release = self._on_release
        parameter = next(model.parameters())
        # The decode graphs pad a batch up to its bucket; the padding rows write their K/V into
        # one extra block beyond the pool, which the scheduler never hands out.
        self.cache = PagedKVCache(
            model.config,
            num_blocks + 1 if decode_graph else num_blocks,
            block_size,
            dtype=parameter.dtype,
            device=parameter.device,
            swap_blocks=swap_blocks,
        )
        self.decode_graphs: DecodeGraphs | None = None
        self.graph_compile_seconds = 0.0
        self.graph_steps = 0
        if decode_graph:
            buckets = buckets_for(num_slots) if decode_graph is True else list(decode_graph)
            self.decode_graphs = DecodeGraphs(model, self.cache, num_blocks, buckets)
            self.graph_compile_seconds = sum(self.decode_graphs.compile_seconds.values())
        self.eos_token_ids = model.config.eos_token_ids
        self.iteration = 0
        # Which request holds each slot. The scheduler moves slots; the hook keeps this in
        # step at the moment a slot is given back, even inside one schedule() call.
        self.slot_owners: list[int | None] = [None] * num_slots
        self._requests: dict[int, Request] = {}
        self._generators: dict[int, torch.Generator | None] = {}
        self.prompt_logprobs = PromptLogprobs()
        self._next_id = 0

    # -- the pool, as callers see it -----------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return self.scheduler.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.scheduler.pool.num_free

    @property
    def num_swap_blocks(self) -> int:
        return self.scheduler.num_swap_blocks

    @property
    def num_free_swap_blocks(self) -> int:
        return self.scheduler.num_free_swap_blocks

    @property
    def block_size(self) -> int:
        return self.scheduler.block_size

    @property
    def num_slots(self) -> int:
        return self.scheduler.num_slots

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
        vocabulary, or a worst case (prompt plus max_tokens) beyond the empty pool raises
        ValueError and leaves the engine as it was.
        """
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be SamplingParams, got {type(params).__name__}")
        prompt = [int(token) for token in prompt_token_ids]
        if not prompt:
            raise ValueError("the prompt is empty: a request needs at least one token")
        vocab_size = self.model.config.vocab_size
        outside = [token for token in prompt if not 0 <= token < vocab_size]
        if outside:
            raise ValueError(f"token ids outside the vocabulary [0, {vocab_size}): {outside[:5]}")
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
        del self._generators[request_id]
        self.prompt_logprobs.forget(request_id)
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

    def _on_release(self, request: Request) -> None:
        self.slot_owners[request.slot] = None

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
        decision = self.scheduler.schedule()
        # Out before in, both before the forward: a block a victim gave up may already be
        # another row's, or a swapped-in request's, in this very decision.
        self.cache.swap_out(decision.blocks_to_swap_out)
        self.cache.swap_in(decision.blocks_to_swap_in)
        for row in decision.rows:
            self.slot_owners[row.request.slot] = row.request.request_id
        logits, prompt_logprobs = self._forward(decision.rows)
        tokens, logprobs, failed = self._sample(decision.rows, logits)
        finished = self.scheduler.update(decision, tokens, self.eos_token_ids)
        for request in finished:
            del self._generators[request.request_id]
            self.prompt_logprobs.forget(request.request_id)
        for request_id in failed:
            self.abort(request_id)
        outcome = self._outcome(decision, finished, tokens, logprobs, prompt_logprobs, failed)
        self.iteration += 1
        return outcome

    def _forward(
        self, scheduled: list[ScheduledRow]
    ) -> tuple[torch.Tensor, dict[int, list[TokenLogprobs]]]:
        """The rows' sampling logits, through the decode graph when a bucket holds them, and
        the prompt logprobs the prefill rows owe (which need logits at every position)."""
        rows = [paged_row(row) for row in scheduled]
        bucket = self._decode_bucket(scheduled)
        if bucket is not None:
            assert self.decode_graphs is not None
            self.graph_steps += 1
            return self.decode_graphs(rows, bucket), {}
        plan = self.prompt_logprobs.plan(scheduled)
        if plan is None:
            return paged_forward(self.model, self.cache, rows, self.layer_steps), {}
        logits = paged_forward(self.model, self.cache, rows, self.layer_steps, plan.logits_at)
        sampling, owed = plan.split(logits)
        return sampling, self.prompt_logprobs.score(plan, owed)

    def _decode_bucket(self, rows: list[ScheduledRow]) -> int | None:
        """The decode graph's bucket for these rows, or None when the step runs eager: no
        graphs, a prefill or chunk among the rows, or no kept bucket holds them all."""
        if self.decode_graphs is None or any(
            row.is_prefill or len(row.token_ids) != 1 for row in rows
        ):
            return None
        return self.decode_graphs.graph_for(len(rows))

    def _sample(
        self, rows: list[ScheduledRow], logits: torch.Tensor
    ) -> tuple[dict[int, int], dict[int, TokenLogprobs], dict[int, str]]:
        """One token per sampling row, each from its own request's parameters, history and
        generator; the log-probabilities of those whose request asked for them; and the
        requests whose logits were not finite, which get no token (a NaN or an infinity
        would otherwise come out as some arbitrary token, and the text as garbage).

        A prefill chunk that stops short of its request's last token is skipped: its logits
        predict a token the request already has, and drawing for it would move the generator.
        """
        sampling = [index for index, row in enumerate(rows) if row.samples]
        if not sampling:
            return {}, {}, {}
        finite = torch.isfinite(logits[sampling]).all(dim=-1).tolist()
        failed = {
            rows[index].request.request_id: "the model's logits were not finite"
            for index, ok in zip(sampling, finite, strict=True)
            if not ok
        }
        indices = [index for index, ok in zip(sampling, finite, strict=True) if ok]
        if not indices:
            return {}, {}, failed
        requests = [rows[index].request for index in indices]
        logits = logits[indices]
        sampled = sample_tokens(
            logits,
            [request.params for request in requests],
            [self._generators[request.request_id] for request in requests],
            [(request.token_ids, len(request.prompt_token_ids)) for request in requests],
        )
        logprobs = {
            request.request_id: token_logprobs(logits[row], token, request.params.logprobs)
            for row, (request, token) in enumerate(zip(requests, sampled, strict=True))
            if request.params.logprobs is not None
        }
        tokens = {request.request_id: t for request, t in zip(requests, sampled, strict=True)}
        return tokens, logprobs, failed

    def _outcome(
        self,
        decision: SchedulerOutput,
        finished: list[Request],
        tokens: dict[int, int],
        logprobs: dict[int, TokenLogprobs],
        prompt_logprobs: dict[int, list[TokenLogprobs]],
        failed: dict[int, str],
    ) -> IterationOutcome:
        """The step as the world sees it, derived from the decision it carried out and what
        the forward and the sampler made of it.

        The pool numbers describe the forward: the blocks held while it ran and the K/V it
        left, finished requests included, whose blocks `update` has already given back.
        """
        rows = decision.rows
        admitted = [request.request_id for request in decision.admitted]
        return IterationOutcome(
            iteration=self.iteration,
            tokens=tokens,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            failed=failed,
            finished=[request.request_id for request in finished],
            evicted=[request.request_id for request in decision.preempted],
            swapped_out=[request.request_id for request in decision.swapped_out],
            swapped_in=[request.request_id for request in decision.swapped_in],
            admitted=admitted,
            # Preempted by recompute before, not "recomputes something": a resumed prefill may
            # find all it had computed in the prefix cache.
            resumed=[
                row.request.request_id
                for row in rows
                if row.request.num_discarded_tokens and row.request.request_id in admitted
            ],
            row_positions={row.request.request_id: row.num_positions for row in rows},
            rows=len(rows),
            prefill_rows=sum(row.is_prefill for row in rows),
            forward_tokens=sum(row.num_positions for row in rows),
            recomputed_tokens=sum(row.recomputed for row in rows),
            cached_tokens=sum(row.cached for row in rows),
            cached_prefix={row.request.request_id: row.cached for row in rows if row.cached},
            num_slots=self.num_slots,
            num_blocks=self.num_blocks,
            block_size=self.block_size,
            held_blocks=decision.held_blocks,
            needed_blocks=sum(blocks_for_length(row.end_position, self.block_size) for row in rows),
            kv_tokens=sum(row.end_position for row in rows),
            blocks_swapped_out=len(decision.blocks_to_swap_out),
            blocks_swapped_in=len(decision.blocks_to_swap_in),
            bytes_per_block=self.cache.bytes_per_block,
            num_swap_blocks=self.num_swap_blocks,
            held_swap_blocks=decision.held_swap_blocks,
        )

    def check_integrity(self) -> None:
        """The scheduler's invariants, plus: every slot owner is the request that holds it."""
        self.scheduler.check_integrity()
        for request in self.scheduler.running:
            if self.slot_owners[request.slot] != request.request_id:
                raise AssertionError(f"slot {request.slot} does not record {request.request_id}")

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


def paged_row(row: ScheduledRow) -> PagedRow:
    """A scheduled row as the paged forward takes it: new tokens, where they start, its blocks."""
    return PagedRow(row.token_ids, row.start_position, row.request.block_table.block_ids)
