"""The model runner's sampler: a step's logits turned into each request's tokens.

Every row that samples is one of two kinds. A plain row draws one token from its logits
(`llmengine.sampling.sample_tokens`) with its request's parameters, history and generator,
after its grammar's mask (`llmengine.structured`) where it has one. A row with drafts keeps
the drafted tokens the model agrees with and adds one of its own
(`llmengine.speculative.verify`). Both kinds are checked for finite logits once, in one read
back: a NaN or an infinity would otherwise come out as some arbitrary token, and the text as
garbage, so such a request gets no token and is reported failed while the others go on.

The sampler keeps what a request carries from step to step: its generator (on the logits'
device: a CUDA row cannot draw from a CPU generator), its grammar's matcher and the prompt
tokens still owed a logprob. It takes them up the first time a request's row reaches it and
lets go when the request is done.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from llmengine.model.config import LlamaConfig
from llmengine.outcome import StepResult
from llmengine.prompt_logprobs import PromptLogprobs
from llmengine.sampling import make_generator, sample_tokens, token_logprobs
from llmengine.scheduling.decision import ScheduledRow
from llmengine.scheduling.request import Request
from llmengine.speculative.verify import cut_at_finish, verify_drafts
from llmengine.structured.matchers import RequestGrammars

NOT_FINITE = "the model's logits were not finite"
NO_TOKEN_ALLOWED = "the grammar allows no token here"


class Sampler:
    """Per-request sampling state, and `sample`, which fills a step's `StepResult`."""

    def __init__(self, config: LlamaConfig, tokenizer: Any, device: torch.device) -> None:
        self.device = device
        self.generators: dict[int, torch.Generator | None] = {}
        # A grammar ends on the model's end tokens; the mask covers its whole vocabulary.
        self.grammars = RequestGrammars(tokenizer, config.vocab_size, config.eos_token_ids)
        self.prompt_logprobs = PromptLogprobs()

    def take_up(self, request: Request) -> None:
        """Start keeping a request's state, the first time one of its rows is scheduled."""
        if request.request_id not in self.generators:
            self.generators[request.request_id] = make_generator(request.params, self.device)
            self.prompt_logprobs.add(request)
            self.grammars.add(request.request_id, request.params)

    def forget(self, request_id: int) -> None:
        """Let go of a finished or aborted request's state (nothing if it was never taken up)."""
        self.generators.pop(request_id, None)
        self.prompt_logprobs.forget(request_id)
        self.grammars.forget(request_id)

    def sample(
        self,
        rows: list[ScheduledRow],
        logits: torch.Tensor,
        draft_logits: torch.Tensor,
        draft_probs: Mapping[int, torch.Tensor],
    ) -> StepResult:
        """The tokens of every row that samples: `logits` `[rows, vocab]` are each row's last
        position's, `draft_logits` those that check the rows' drafts (`draft_logits_at`, in
        row order), `draft_probs` the distributions a draft model drew a sampled row's drafts
        from. A prefill chunk that stops short of its request's last token draws nothing: its
        logits predict a token the request already has, and drawing would move the
        generator."""
        result = StepResult()
        drawing = [index for index, row in enumerate(rows) if row.samples]
        if not drawing:
            return result
        finite = self._finite(rows, drawing, logits, draft_logits)
        plain, drafted, offset = [], [], 0
        for index in drawing:
            row = rows[index]
            drafts = len(row.draft_token_ids)
            if not finite[index]:
                result.failed[row.request.request_id] = NOT_FINITE
            elif drafts:
                own = draft_logits[offset : offset + drafts]
                drafted.append((row, torch.cat([own, logits[index : index + 1]])))
            else:
                plain.append(index)
            offset += drafts
        self._draw(rows, plain, logits, result)
        for row, row_logits in drafted:
            self._verify(row, row_logits, draft_probs.get(row.request.request_id), result)
        return result

    @staticmethod
    def _finite(
        rows: list[ScheduledRow],
        drawing: list[int],
        logits: torch.Tensor,
        draft_logits: torch.Tensor,
    ) -> dict[int, bool]:
        """Whether each drawing row's logits, its drafts' included, are all finite: one read
        back for the whole step."""
        checks = torch.isfinite(logits[drawing]).all(dim=-1)
        if len(draft_logits):
            checks = torch.cat([checks, torch.isfinite(draft_logits).all(dim=-1)])
        flags = checks.tolist()
        finite, offset = {}, len(drawing)
        for position, index in enumerate(drawing):
            drafts = len(rows[index].draft_token_ids)
            finite[index] = flags[position] and all(flags[offset : offset + drafts])
            offset += drafts
        return finite

    def _draw(
        self, rows: list[ScheduledRow], plain: list[int], logits: torch.Tensor, result: StepResult
    ) -> None:
        """One token for each plain row. A constrained row has every token its grammar refuses
        set to -inf before penalties, temperature, top-k and top-p, and its matcher moves past
        the token drawn; its log-probabilities stay those of the raw logits."""
        requests = [rows[index].request for index in plain]
        raw = logits[plain]
        masked = raw
        allowed = self.grammars.allowed([request.request_id for request in requests])
        if allowed is not None:
            masked = raw.masked_fill(~allowed.to(raw.device), float("-inf"))
            kept = []
            for position, ok in enumerate(allowed.any(dim=-1).tolist()):
                if ok:
                    kept.append(position)
                else:
                    result.failed[requests[position].request_id] = NO_TOKEN_ALLOWED
            requests, raw, masked = [requests[i] for i in kept], raw[kept], masked[kept]
        if not requests:
            return
        tokens = sample_tokens(
            masked,
            [request.params for request in requests],
            [self.generators[request.request_id] for request in requests],
            [(request.token_ids, len(request.prompt_token_ids)) for request in requests],
        )
        for position, (request, token) in enumerate(zip(requests, tokens, strict=True)):
            result.tokens[request.request_id] = token
            self.grammars.accept(request.request_id, token)
            if request.params.logprobs is not None:
                result.logprobs[request.request_id] = token_logprobs(
                    raw[position], token, request.params.logprobs
                )

    def _verify(
        self,
        row: ScheduledRow,
        logits: torch.Tensor,
        draft_probs: torch.Tensor | None,
        result: StepResult,
    ) -> None:
        """A drafted row's tokens: the drafts the model keeps and one of its own, cut at the
        first token that finishes the request; and how many it proposed and kept."""
        request, drafts = row.request, row.draft_token_ids
        kept = verify_drafts(
            logits, drafts, request.params, self.generators[request.request_id], draft_probs
        )
        result.drafts[request.request_id] = (len(drafts), len(kept) - 1)
        result.tokens[request.request_id] = cut_at_finish(kept, request)
