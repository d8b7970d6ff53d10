"""The next step's inputs built on a worker thread while this step's forward runs.

On one stream of a small model the host's biggest share of a step, after the forward, is
preparing the forward's inputs: positions, write slots and block tables as small tensors
(`GatheredAttention`). None of that depends on the token the forward in flight will
produce, only on where each row stands, so it can be built in the forward's shadow: torch
releases the GIL inside each operator, and another thread runs while the forward's
operators compute. This is the part of vLLM's asynchronous scheduling (and SGLang's overlap
scheduler) that a synchronous `Engine.step` allows: the step still returns its own tokens.

The forward stays on the engine's thread and the guess goes to the worker, not the other
way round: the step then never sleeps waiting for another thread to be woken (on a loaded
machine a wake-up can cost more than the work it hands over); by the time the next step
asks for the guess, the worker has had a whole forward, sampling and scheduling to build it.

The guess is the one vLLM's asynchronous scheduler makes: every row of this step comes back
in the next as a decode of one token, one position further on, with the blocks it holds now.
The next step's real rows are compared with the guess before it is used (same rows, start
positions, new lengths and block tables: the attention built ahead is then exactly what
building it again would give) and anything else discards it: a request that finished, was
preempted or arrived, a row that needs a new block, a prefill chunk, drafted tokens. The
guess touches neither the scheduler nor the cache, so a wrong one costs only its time.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from llmengine.kv.paged_cache import PagedKVCache
from llmengine.runner.attention import GatheredAttention, PagedRow
from llmengine.runner.forward import PackedInputs, packed_inputs, packed_token_ids
from llmengine.runner.prepare import ForwardPlan

# What the attention inputs of a row depend on: start position, new positions, block table.
RowKey = tuple[int, int, tuple[int, ...]]


def row_keys(rows: list[PagedRow]) -> tuple[RowKey, ...]:
    return tuple((row.start_position, len(row.token_ids), tuple(row.block_ids)) for row in rows)


@dataclass(frozen=True, slots=True)
class Ahead:
    """The attention inputs built for the rows a step was guessed to have."""

    keys: tuple[RowKey, ...]
    attention: GatheredAttention


class OverlappedPreparer:
    """Guesses each eager step's successor on one worker thread while the step's forward runs.

    `overlapped_steps` counts the guesses finished before the forward they ran beside (the
    work done wholly in its shadow); `reused_steps` the steps whose inputs came from a guess.
    """

    def __init__(self, cache: PagedKVCache) -> None:
        self.cache = cache
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmengine-ahead")
        self._ahead: Future[Ahead | None] | None = None
        self.overlapped_steps = 0
        self.reused_steps = 0

    def guess_during(self, plan: ForwardPlan) -> None:
        """Start guessing the step after `plan` on the worker, just before its forward runs.
        A decode graph's step is not guessed after: its inputs are the graph's own buffers."""
        self._ahead = None
        if plan.bucket is not None or not plan.rows:
            return
        guessed = []
        for row in plan.rows:  # copied here: the block tables change once the step is over
            start = row.start_position + len(row.token_ids)
            if start // self.cache.block_size >= len(row.block_ids):
                return  # a block it does not hold yet, which the scheduler has yet to pick
            guessed.append(PagedRow([0], start, list(row.block_ids)))  # the token is unknown
        self._ahead = self._worker.submit(self._build, guessed)

    def forward_done(self) -> None:
        """The forward the guess ran beside has returned: count the guess if it was ready."""
        if self._ahead is not None and self._ahead.done():
            self.overlapped_steps += 1

    def inputs(self, rows: list[PagedRow]) -> PackedInputs:
        """The eager forward's inputs for `rows`: the guess's attention when the rows are the
        ones guessed, with their token ids, else built in full (`packed_inputs`)."""
        pending, self._ahead = self._ahead, None
        ahead = None if pending is None else pending.result()  # almost always ready by now
        if ahead is not None and ahead.keys == row_keys(rows):
            self.reused_steps += 1
            return packed_token_ids(rows, self.cache.device), ahead.attention
        return packed_inputs(self.cache, rows)

    def _build(self, guessed: list[PagedRow]) -> Ahead | None:
        # Inference mode is per thread: the worker enters it as the runner's own thread does.
        try:
            with torch.inference_mode():
                return Ahead(row_keys(guessed), GatheredAttention(self.cache, guessed))
        except Exception:  # a guess that cannot be built is no guess; the real step will say
            return None

    def close(self) -> None:
        """Stop the worker thread (after the guess in progress, if any)."""
        self._worker.shutdown(wait=True)
