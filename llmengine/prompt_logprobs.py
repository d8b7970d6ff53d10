"""Prompt logprobs: what the model thought of each prompt token, computed by the prefill.

A forward usually keeps the logits of each row's last new position only: that is all
sampling needs. A request with `prompt_logprobs` also needs the logits of every prompt
position, because the logits at position p are the model's distribution for token p + 1.
`PromptLogprobs` remembers, per such request, the next prompt token still owed, so that a
prompt prefilled in chunks is covered chunk by chunk and a prompt recomputed after a
preemption is not reported twice. The first prompt token has no logprob: nothing precedes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmengine.outcome import TokenLogprobs
from llmengine.sampling import token_logprobs
from llmengine.scheduling.decision import ScheduledRow, packed_starts
from llmengine.scheduling.request import Request


@dataclass(slots=True)
class LogitsPlan:
    """Where one step needs logits: each row's last new position first (what sampling reads),
    then the positions owed to prompt logprobs, as packed indices for `paged_forward`."""

    logits_at: list[int]
    owed: list[tuple[Request, int]]  # (request, prompt token) for each extra position, in order

    def split(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The sampling logits `[rows, vocab]` and the prompt logprobs' logits."""
        num_rows = len(self.logits_at) - len(self.owed)
        return logits[:num_rows], logits[num_rows:]


class PromptLogprobs:
    """The prompt tokens each request still waits to have scored, by request id."""

    def __init__(self) -> None:
        self._next_token: dict[int, int] = {}

    def add(self, request: Request) -> None:
        if request.params.prompt_logprobs is not None and len(request.prompt_token_ids) > 1:
            self._next_token[request.request_id] = 1

    def forget(self, request_id: int) -> None:
        self._next_token.pop(request_id, None)

    def plan(self, rows: list[ScheduledRow]) -> LogitsPlan | None:
        """The step's logits positions, or None when no row owes a prompt logprob."""
        if not any(row.request.request_id in self._next_token for row in rows):
            return None
        first = packed_starts(rows)
        logits_at = [end - 1 for end in first[1:]]
        owed: list[tuple[Request, int]] = []
        for row, packed_start in zip(rows, first[:-1], strict=True):
            request = row.request
            next_token = self._next_token.get(request.request_id)
            if next_token is None:
                continue
            prompt_length = len(request.prompt_token_ids)
            # Position p's logits score prompt token p + 1.
            for position in range(max(next_token - 1, row.start_position), row.end_position):
                if position + 1 >= prompt_length:
                    break
                logits_at.append(packed_start + position - row.start_position)
                owed.append((request, position + 1))
        return LogitsPlan(logits_at, owed)

    def score(
        self, plan: LogitsPlan, logits: torch.Tensor, failed: dict[int, str]
    ) -> dict[int, list[TokenLogprobs]]:
        """The prompt logprobs these logits give, by request id, in prompt order. A request
        whose scoring raises is added to `failed`, with why, and reports none: one request's
        fault is not the step's."""
        scored: dict[int, list[TokenLogprobs]] = {}
        for (request, token_index), row in zip(plan.owed, logits, strict=True):
            request_id = request.request_id
            if request_id in failed:
                continue
            try:
                token = request.prompt_token_ids[token_index]
                k = request.params.prompt_logprobs or 0
                scored.setdefault(request_id, []).append(token_logprobs(row, token, k))
            except Exception as error:
                failed[request_id] = f"scoring its prompt failed: {error}"
                scored.pop(request_id, None)
                continue
            self._next_token[request_id] = token_index + 1
            if token_index + 1 == len(request.prompt_token_ids):
                del self._next_token[request_id]  # the whole prompt is scored
        return scored
