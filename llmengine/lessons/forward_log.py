"""Watch a model's forwards: how many positions each one computed, and when it started.

The log hooks the embedding lookup, which every forward passes through exactly once with
the token ids it is about to compute, so it sees the cached and the uncached loops alike
without either of them knowing. Lessons use it to count work instead of asserting it.
"""

from __future__ import annotations

import itertools
import time
from types import TracebackType

import torch


class ForwardLog:
    """Records `input_ids.numel()` and the start time of every forward while active.

    Use it as a context manager around the code to measure. A padded batch would count its
    pad positions too; the loops measured with it (plain generation, the contiguous cache)
    never pad.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.embedding: torch.nn.Module = model.embed_tokens
        self.positions: list[int] = []
        self.starts: list[float] = []
        self.end: float | None = None
        self._handle: torch.utils.hooks.RemovableHandle | None = None

    def _record(self, _module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        self.positions.append(args[0].numel())
        self.starts.append(time.perf_counter())

    def __enter__(self) -> ForwardLog:
        self._handle = self.embedding.register_forward_pre_hook(self._record)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.end = time.perf_counter()
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    @property
    def cumulative_positions(self) -> list[int]:
        """Positions computed by the first 1, 2, ... forwards."""
        return list(itertools.accumulate(self.positions))

    @property
    def seconds_per_forward(self) -> list[float]:
        """Each forward's share of the wall clock: from its start to the next one's (or the end).

        It includes whatever ran between forwards (sampling, bookkeeping), which is part of
        what a generation step costs.
        """
        if self.end is None:
            raise RuntimeError("the log is still recording: read it after the `with` block")
        bounds = [*self.starts, self.end]
        return [after - before for before, after in itertools.pairwise(bounds)]
