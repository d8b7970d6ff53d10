"""The engine: a scheduler, a paged KV cache and a model, one step at a time.

`step()` is one scheduling decision and one forward over every scheduled row: fresh prefills,
resumed prefills (prompt plus the tokens generated before the preemption: resume, not
restart) and decodes, all in the same call. It reports what happened as an
`IterationOutcome`, which is all a benchmark needs to see.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from llmengine.blocks import blocks_for_length
from llmengine.model import Llama
from llmengine.outcome import IterationOutcome
from llmengine.paged_cache import PagedKVCache, PagedRow, paged_forward
from llmengine.request import Request, RequestState
from llmengine.sampling import SamplingParams, make_generator, sample_tokens
from llmengine.scheduler import Scheduler


class Engine:
    """Continuous batching over a paged KV cache.

    `num_blocks` KV blocks of `block_size` tokens form the pool; at most `num_slots` requests
    run in one forward. `policy="reserve"` admits a request only when the pool can hold its
    worst case (Week 8); `policy="incremental"` buys blocks a step at a time and preempts the
    youngest running request by recompute when the pool runs dry (Day 33).
    """

    def __init__(
        self,
        model: Llama,
        *,
        num_blocks: int,
        block_size: int = 16,
        num_slots: int = 8,
        policy: str = "incremental",
        watermark: int = 0,
        tokenizer: Any = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.scheduler = Scheduler(num_blocks, block_size, num_slots, policy, watermark)
        self.scheduler.on_release = self._on_release
        parameter = next(model.parameters())
        self.cache = PagedKVCache(
            model.config, num_blocks, block_size, dtype=parameter.dtype, device=parameter.device
        )
        self.eos_token_ids = model.config.eos_token_ids
        self.iteration = 0
        # Which request holds each slot. The scheduler moves slots; the hook keeps this in
        # step at the moment a slot is given back, even inside one schedule() call.
        self.slot_owners: list[int | None] = [None] * num_slots
        self._requests: dict[int, Request] = {}
        self._generators: dict[int, torch.Generator | None] = {}
        self._next_id = 0

    # -- the pool, as callers see it -----------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return self.scheduler.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.scheduler.pool.num_free

    @property
    def block_size(self) -> int:
        return self.scheduler.block_size

    @property
    def num_slots(self) -> int:
        return self.scheduler.num_slots

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

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
        request = Request(self._next_id, prompt, params, self._next_id, self.block_size)
        self.scheduler.add(request)
        self._next_id += 1
        self._requests[request.request_id] = request
        self._generators[request.request_id] = make_generator(params)
        return request.request_id

    def abort(self, request_id: int) -> None:
        """Stop a waiting, running or preempted request; its blocks and slot go back now."""
        request = self.request(request_id)
        if not request.is_live:
            raise ValueError(f"request {request_id} is already {request.state.value}")
        self.scheduler.abort(request)
        self._generators.pop(request_id, None)

    def _on_release(self, request: Request) -> None:
        self.slot_owners[request.slot] = None

    # -- one iteration -------------------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> IterationOutcome:
        """One scheduling decision and one forward; a step with nothing to run is empty."""
        decision = self.scheduler.schedule()
        outcome = IterationOutcome(
            iteration=self.iteration,
            evicted=[r.request_id for r in decision.preempted],
            num_slots=self.num_slots,
            num_blocks=self.num_blocks,
        )
        if decision.rows:
            for row in decision.rows:
                self.slot_owners[row.request.slot] = row.request.request_id
            logits = paged_forward(
                self.model,
                self.cache,
                [
                    PagedRow(row.token_ids, row.start_position, row.request.block_table.block_ids)
                    for row in decision.rows
                ],
            )
            requests = [row.request for row in decision.rows]
            sampled = sample_tokens(
                logits,
                [r.params for r in requests],
                [self._generators[r.request_id] for r in requests],
            )
            outcome.tokens = {r.request_id: t for r, t in zip(requests, sampled, strict=True)}
            finished = self.scheduler.update(decision, outcome.tokens, self.eos_token_ids)
            for request in finished:
                self._generators.pop(request.request_id, None)
            outcome.finished = [r.request_id for r in finished]
            outcome.admitted = [row.request.request_id for row in decision.rows if row.is_prefill]
            outcome.resumed = [row.request.request_id for row in decision.rows if row.recomputed]
            outcome.row_positions = {
                row.request.request_id: row.num_positions for row in decision.rows
            }
            outcome.rows = len(decision.rows)
            outcome.prefill_rows = len(outcome.admitted)
            outcome.forward_tokens = sum(outcome.row_positions.values())
            outcome.recomputed_tokens = sum(row.recomputed for row in decision.rows)
            self.iteration += 1
        self._record_pool(outcome)
        return outcome

    def _record_pool(self, outcome: IterationOutcome) -> None:
        tables = [request.block_table for request in self.scheduler.running]
        outcome.free_blocks = self.num_free_blocks
        outcome.block_size = self.block_size
        outcome.held_blocks = self.scheduler.pool.num_held
        outcome.kv_tokens = sum(table.num_tokens for table in tables)
        outcome.needed_blocks = sum(
            blocks_for_length(table.num_tokens, self.block_size) for table in tables
        )

    def check_integrity(self) -> None:
        """The scheduler's invariants, plus: every slot owner is the request that holds it."""
        self.scheduler.check_integrity()
        for request in self.scheduler.running:
            if request.state == RequestState.RUNNING and (
                self.slot_owners[request.slot] != request.request_id
            ):
                raise AssertionError(f"slot {request.slot} does not record {request.request_id}")

    # -- run to completion ---------------------------------------------------------------

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams],
    ) -> list[list[int]]:
        """Run `prompts` to completion; generated token ids in the order of `prompts`."""
        per_prompt = [params] * len(prompts) if isinstance(params, SamplingParams) else params
        if len(per_prompt) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(per_prompt)} sampling params")
        ids = []
        try:
            for prompt, prompt_params in zip(prompts, per_prompt, strict=True):
                ids.append(self.add_request(prompt, prompt_params))
        except ValueError:
            for request_id in ids:
                self.abort(request_id)
            raise
        while self.has_unfinished():
            self.step()
        return [self._requests.pop(request_id).output_token_ids for request_id in ids]

    def generate_text(self, prompts: Sequence[str], params: SamplingParams) -> list[str]:
        """`generate` on strings, through the engine's tokenizer."""
        if self.tokenizer is None:
            raise ValueError("this engine has no tokenizer: pass tokenizer= to Engine")
        encoded = [self.tokenizer.encode(prompt) for prompt in prompts]
        outputs = self.generate(encoded, params)
        return [self.tokenizer.decode(tokens, skip_special_tokens=True) for tokens in outputs]
