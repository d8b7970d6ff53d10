"""The model runner's sampler: a step's logits turned into each request's tokens.

Every row that samples is one of two kinds. A plain row draws one token from its logits
(`llmengine.sampling.sample_tokens`) with its request's parameters, history and generator,
after its grammar's mask (`llmengine.structured`) where it has one. A row with drafts keeps
the drafted tokens the model agrees with and adds one of its own
(`llmengine.speculative.verify`). Either kind is checked for finite logits: a NaN or an
infinity would otherwise come out as some arbitrary token, and the text as garbage, so such a
request gets no token and is reported failed while the others go on. The plain rows' tokens
and their checks come back from the device together, in one transfer: on a GPU a step of
plain rows waits for the device once (a top-p row, logprobs, drafts and grammars add theirs).

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
from llmengine.runner.row_faults import together_or_alone
from llmengine.sampling import (
    draw_tokens,
    make_generator,
    suppressed_tokens,
    token_logprobs,
    tokens_and_finite,
)
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
        failed: Mapping[int, str] | None = None,
        greedy_picks: torch.Tensor | None = None,
    ) -> StepResult:
        """The tokens of every row that samples: `logits` `[rows, vocab]` are each row's last
        position's, `draft_logits` those that check the rows' drafts (`draft_logits_at`, in
        row order), `draft_probs` the distributions a draft model drew a sampled row's drafts
        from. A prefill chunk that stops short of its request's last token draws nothing: its
        logits predict a token the request already has, and drawing would move the
        generator. The requests in `failed` (with why) draw nothing and stay failed: one
        request's fault is never another's. `greedy_picks` `[2, rows]`, when the forward
        computed them (a decode graph), are each row's argmax and whether its logits are
        finite: a step whose rows are all plain greedy reads them back and runs nothing else."""
        result = StepResult(failed=dict(failed or {}))
        plain = [
            index
            for index, row in enumerate(rows)
            if row.samples
            and not row.draft_token_ids
            and row.request.request_id not in result.failed
        ]
        drafted = [index for index, row in enumerate(rows) if row.draft_token_ids]
        if plain:
            self._draw(rows, plain, logits, result, greedy_picks)
        if drafted:
            self._check_drafts(rows, drafted, logits, draft_logits, draft_probs, result)
        return result

    def _draw(
        self,
        rows: list[ScheduledRow],
        plain: list[int],
        logits: torch.Tensor,
        result: StepResult,
        greedy_picks: torch.Tensor | None = None,
    ) -> None:
        """One token for each plain row, and whether its logits were finite, read back
        together: the step's one transfer from the device. A constrained row has every token
        its grammar refuses set to -inf before penalties, temperature, top-k and top-p, and
        its matcher moves past the token drawn; its log-probabilities stay those of the raw
        logits. `min_tokens` takes the end and stop tokens off what the grammar allows (the
        draw masks them again, as for any row): a grammar left allowing nothing, one that is
        complete before `min_tokens`, fails its request alone (`NO_TOKEN_ALLOWED`), as does a
        row whose grammar, draw or log-probabilities raise, one that drew a token its mask
        refused, or one that would end before its grammar is complete: no output outside its
        constraint is ever kept. Rows that are all plain greedy (`SamplingParams.plain_greedy`) take
        `greedy_picks` when given: the argmax and finite check the forward made already."""
        requests = [rows[index].request for index in plain]
        if greedy_picks is not None and all(r.params.plain_greedy for r in requests):
            picks = greedy_picks if len(plain) == greedy_picks.shape[1] else greedy_picks[:, plain]
            drawn, finite_rows = picks.tolist()
            self._keep(requests, drawn, finite_rows, None, None, result)
            return
        raw = logits[plain]
        masked = raw
        allowed = self.grammars.allowed([r.request_id for r in requests], result.failed)
        if allowed is not None:
            for position, request in enumerate(requests):
                banned = suppressed_tokens(
                    request.params,
                    request.num_output_tokens,
                    request.eos_token_ids,
                    allowed.shape[-1],
                )
                allowed[position, banned] = False
            masked = raw.masked_fill(~allowed.to(raw.device), float("-inf"))
            kept = []
            for position, ok in enumerate(allowed.any(dim=-1).tolist()):
                request_id = requests[position].request_id
                if ok:
                    kept.append(position)
                elif request_id not in result.failed:
                    result.failed[request_id] = NO_TOKEN_ALLOWED
            requests, raw, masked = [requests[i] for i in kept], raw[kept], masked[kept]
            allowed = allowed[kept]
        if not requests:
            return
        tokens = self._tokens(requests, masked, result)
        drawn, finite_rows = tokens_and_finite(tokens, raw).tolist()
        self._keep(requests, drawn, finite_rows, allowed, raw, result)

    def _keep(
        self,
        requests: list[Request],
        drawn: list[int],
        finite_rows: list[int],
        allowed: torch.Tensor | None,
        raw: torch.Tensor | None,
        result: StepResult,
    ) -> None:
        """Keep each request's drawn token, unless its logits were not finite, its grammar
        masked the token out, or keeping it fails (`_draw`): `raw` are the rows' logits,
        which only a row that asks for logprobs reads (None: no row does)."""
        for position, (request, token) in enumerate(zip(requests, drawn, strict=True)):
            request_id = request.request_id
            if request_id in result.failed:
                continue
            if not finite_rows[position]:
                result.failed[request_id] = NOT_FINITE
                continue
            if allowed is not None and not allowed[position, token]:
                result.failed[request_id] = f"drew token {token}, which its grammar masked out"
                continue
            try:
                self.grammars.accept(request_id, token)
                if self._ends_incomplete(request, token):
                    result.failed[request_id] = (
                        f"token {token} ends an output its grammar has not completed"
                    )
                    continue
                if request.params.logprobs is not None and raw is not None:
                    result.logprobs[request_id] = token_logprobs(
                        raw[position], token, request.params.logprobs
                    )
            except Exception as error:
                result.failed[request_id] = f"keeping token {token} failed: {error}"
                continue
            result.tokens[request_id] = token

    def _ends_incomplete(self, request: Request, token: int) -> bool:
        """Whether `token` would finish a constrained request (a stop or end token, not the
        budget) while its grammar is still incomplete: a 'stop' that would carry output
        outside its constraint."""
        if request.params.constraint is None:  # the common row: nothing to check
            return False
        finish = request.finish_reason_after(request.num_output_tokens + 1, token)
        return finish in ("stop", "eos") and not self.grammars.is_complete(request.request_id)

    def _tokens(
        self, requests: list[Request], logits: torch.Tensor, result: StepResult
    ) -> torch.Tensor:
        """`draw_tokens` for these rows, on the device. If the batch raises, each seeded
        generator goes back to where it stood and the rows are drawn one by one, so a row
        that raises alone fails alone and every other row draws exactly what it would have
        (its token is then 0, never kept)."""
        params = [request.params for request in requests]
        generators = [self.generators[request.request_id] for request in requests]
        histories = [(request.token_ids, len(request.prompt_token_ids)) for request in requests]
        eos_token_ids = [request.eos_token_ids for request in requests]
        drawn: list[torch.Tensor] = []  # the batch's tokens, or those the rows draw alone

        def together() -> None:
            drawn.append(draw_tokens(logits, params, generators, histories, eos_token_ids))

        def alone(row: int) -> None:
            if not drawn:
                drawn.append(torch.zeros(len(requests), dtype=torch.long, device=logits.device))
            drawn[0][row : row + 1] = draw_tokens(
                logits[row : row + 1], params[row : row + 1], generators[row : row + 1],
                histories[row : row + 1], eos_token_ids[row : row + 1],
            )  # fmt: skip

        for row, error in together_or_alone(generators, together, alone).items():
            result.failed[requests[row].request_id] = f"sampling failed: {error}"
        return drawn[0]

    def _check_drafts(
        self,
        rows: list[ScheduledRow],
        drafted: list[int],
        logits: torch.Tensor,
        draft_logits: torch.Tensor,
        draft_probs: Mapping[int, torch.Tensor],
        result: StepResult,
    ) -> None:
        """Each drafted row's logits: its drafts' (`draft_logits`, in row order), then its
        last position's; a row with any that is not finite fails, the others are verified,
        and one whose check raises fails alone."""
        offset, checked = 0, []
        for index in drafted:  # every row with drafts: their logits lie in row order
            drafts = len(rows[index].draft_token_ids)
            if rows[index].request.request_id not in result.failed:
                own = draft_logits[offset : offset + drafts]
                checked.append((rows[index], torch.cat([own, logits[index : index + 1]])))
            offset += drafts
        if not checked:
            return
        finite = torch.stack([torch.isfinite(each).all() for _, each in checked]).tolist()
        for (row, row_logits), ok in zip(checked, finite, strict=True):
            request_id = row.request.request_id
            if not ok:
                result.failed[request_id] = NOT_FINITE
                continue
            try:
                self._verify(row, row_logits, draft_probs.get(request_id), result)
            except Exception as error:
                result.failed[request_id] = f"checking the drafts failed: {error}"

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
        tokens = cut_at_finish(kept, request)
        result.drafts[request.request_id] = (len(drafts), len(kept) - 1)
        result.tokens[request.request_id] = tokens
