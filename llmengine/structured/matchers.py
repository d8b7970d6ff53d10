"""The grammar state of an engine's constrained requests, and the masks it puts on logits.

Each constrained request has a matcher from the time it is added until it finishes or is
aborted. A matcher moves only when the sampler keeps a token, and a preempted request keeps
its generated tokens (recompute or swap alike), so its matcher stays valid through any
preemption with nothing to replay; prefill chunks that sample nothing never consult it.

A matcher that breaks a limit goes into an error state whose mask allows only the end of
sequence, so an output cut short would look finished. Here an error, on the mask or on a
token, is a failure of that request alone, and its grammar leaves the compiler's cache.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from llmengine.params import SamplingParams
from llmengine.structured.constraint import Constraint
from llmengine.structured.grammar import GrammarCompiler
from llmengine.structured.limits import reason


class RequestGrammars:
    """Per-request matchers over one lazily built `GrammarCompiler`.

    The compiler is built on the first constraint (reading the tokenizer costs a few
    milliseconds), so an engine that never sees one never imports llguidance. `mask_seconds`
    and `num_masks` add up the time spent computing masks, the cost a constraint adds to a
    step.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._eos_token_ids = tuple(eos_token_ids)
        self._compiler: GrammarCompiler | None = None
        self._matchers: dict[int, Any] = {}
        self._constraints: dict[int, Constraint] = {}
        self.mask_seconds = 0.0
        self.num_masks = 0

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, tokenizer: Any) -> None:
        """A new tokenizer, before any request holds a matcher of the old one."""
        if self._matchers:
            raise ValueError("the tokenizer cannot change while constrained requests run")
        self._tokenizer = tokenizer
        self._compiler = None

    @property
    def compiler(self) -> GrammarCompiler:
        """The compiler for this engine's tokenizer; ValueError when it has none."""
        if self._compiler is None:
            if self._tokenizer is None:
                raise ValueError(
                    "a constrained request needs the engine's tokenizer: pass tokenizer= to Engine"
                )
            self._compiler = GrammarCompiler(self._tokenizer, self._vocab_size, self._eos_token_ids)
        return self._compiler

    def add(self, request_id: int, params: SamplingParams) -> None:
        if params.constraint is not None:
            self._matchers[request_id] = self.compiler.matcher(params.constraint)
            self._constraints[request_id] = params.constraint

    def forget(self, request_id: int) -> None:
        self._matchers.pop(request_id, None)
        self._constraints.pop(request_id, None)

    def is_constrained(self, request_id: int) -> bool:
        return request_id in self._matchers

    def allowed(
        self, request_ids: Sequence[int], failed: dict[int, str] | None = None
    ) -> torch.Tensor | None:
        """`[rows, vocab]` booleans, True where row i's grammar allows the token (every token
        for an unconstrained row); None when no row is constrained. A matcher that raises or
        errs while computing its mask allows nothing, and its request is put in `failed` with
        why (raised when no `failed` is given)."""
        rows = [row for row, request_id in enumerate(request_ids) if request_id in self._matchers]
        if not rows:
            return None
        start = time.perf_counter()
        words = (self._vocab_size + 31) // 32
        bitmask = torch.full((len(request_ids), words), -1, dtype=torch.int32)
        for row in rows:
            view, request_id = bitmask[row], request_ids[row]
            try:
                matcher = self._matchers[request_id]
                matcher.unsafe_compute_mask_ptr(view.data_ptr(), view.numel() * view.element_size())
                self._check(request_id, matcher)
            except Exception as error:
                if failed is None:
                    raise
                view.zero_()
                failed[request_id] = f"the grammar failed: {error}"
        # Token 32w + i is bit i of word w: little-endian bytes, each read low bit first.
        bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1, bitorder="little")
        allowed = torch.from_numpy(bits[:, : self._vocab_size]).bool()
        self.mask_seconds += time.perf_counter() - start
        self.num_masks += len(rows)
        return allowed

    def accept(self, request_id: int, token_id: int) -> None:
        """Move a constrained request's matcher past the token the sampler kept."""
        matcher = self._matchers.get(request_id)
        if matcher is None:
            return
        if not matcher.consume_token(token_id):
            self._check(request_id, matcher)
            raise RuntimeError(f"the grammar refused token {token_id}, which its mask allowed")
        self._check(request_id, matcher)

    def is_complete(self, request_id: int) -> bool:
        """Whether the request's output so far is a whole sentence of its grammar (True for
        an unconstrained request): what an output that ends on a stop or end token must be."""
        matcher = self._matchers.get(request_id)
        if matcher is None:
            return True
        return not matcher.is_error() and (matcher.is_accepting() or matcher.is_stopped())

    def _check(self, request_id: int, matcher: Any) -> None:
        """RuntimeError naming the limit when the matcher is in its error state; its grammar
        leaves the cache, since the lexer every copy shares may be what failed."""
        if matcher.is_error():
            self.compiler.forget(self._constraints[request_id])
            raise RuntimeError(reason(matcher.get_error()))
