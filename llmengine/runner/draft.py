"""A draft model: a smaller Llama with the target's tokenizer guesses the next tokens.

The draft keeps its own paged cache on the target's block tables: the same block ids, its
own layers and heads. Every position the target computes, the draft computes too (each
step's rows go through the draft first), so preemption, swap, prefix caching and aborts
need nothing of their own: a swap copies the same blocks in both caches, a recomputed
request's prefill refills both, and a cached block holds both models' K/V.

Per step, for the rows that may speculate: the draft's first forward over every row gives
each row's first guess, then k - 1 more one-token forwards give the rest, each drawn from
the draft's own distribution (its argmax for greedy rows), which the verifier needs for a
sampled row (`llmengine.speculative.verify`). The model runner owns it and runs it before
the target's forward.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from llmengine.kv.paged_cache import PagedKVCache
from llmengine.model.llama import Llama
from llmengine.runner.attention import PagedRow
from llmengine.runner.forward import paged_forward
from llmengine.runner.loading import load_model
from llmengine.runner.row_faults import together_or_alone
from llmengine.sampling import apply_logit_bias, dense_distribution, draw_one
from llmengine.scheduling.decision import ScheduledRow

Generators = Mapping[int, torch.Generator | None]


class DraftModel:
    """The draft and its cache, a twin of the target's; `propose` fills the scheduled rows'
    drafts in place."""

    def __init__(self, model: Llama, target: Llama, target_cache: PagedKVCache) -> None:
        if model.config.vocab_size != target.config.vocab_size:
            raise ValueError(
                f"the draft model's vocabulary ({model.config.vocab_size} tokens) is not the "
                f"target's ({target.config.vocab_size}): a draft must share the target's "
                "tokenizer"
            )
        self.model = model
        self.cache = target_cache.like(model.config)
        self._computed: dict[int, int] = {}  # positions of each request with the draft's K/V
        # This step's sampled rows: the distributions their drafts were drawn from, [k, vocab].
        self.probs: dict[int, torch.Tensor] = {}

    def forget(self, request_id: int) -> None:
        self._computed.pop(request_id, None)

    @torch.inference_mode()
    def propose(self, rows: list[ScheduledRow], generators: Generators) -> None:
        """Fill each row's `draft_token_ids` (reserved by the scheduler) with the draft's
        guesses, after bringing the draft's K/V level with what the target will compute.

        A row whose proposal raises goes on without drafts (`drop_drafts`) rather than
        failing: drafts decide how fast a request goes, never what it gets (the target keeps
        only the drafts it agrees with, and a sampled row's tokens follow its own sampler
        whatever was guessed), so losing them costs a step's speed-up. Which row raised is
        told by proposing again one row at a time, every seeded generator put back first,
        so each other row guesses what it would have guessed alone. (A row whose catch-up
        failed leaves the draft without some of its K/V: later guesses for it are kept less
        often, never wrong.)"""
        seeded = [generators.get(row.request.request_id) for row in rows]
        probs: dict[int, torch.Tensor] = {}  # the rows' draft distributions, when each went alone
        went_alone: list[int] = []

        def alone(index: int) -> None:
            went_alone.append(index)
            self._propose([rows[index]], generators)
            probs.update(self.probs)

        for index in together_or_alone(seeded, lambda: self._propose(rows, generators), alone):
            rows[index].drop_drafts()
        if went_alone:
            self.probs = probs

    def _propose(self, rows: list[ScheduledRow], generators: Generators) -> None:
        """`propose`'s work for `rows` together, raising whatever any of them raises."""
        self.probs.clear()
        paged = [self._catch_up_row(row) for row in rows]
        logits = paged_forward(self.model, self.cache, paged)
        guessing = [index for index, row in enumerate(rows) if row.draft_token_ids]
        # The catch-up reached each row's last token. The guessing forwards below write K/V
        # past it but are not counted: the next catch-up starts here and computes the kept
        # drafts again.
        for row in rows:
            self._computed[row.request.request_id] = row.end_position - len(row.draft_token_ids)
        if not guessing:
            return
        k = max(len(rows[index].draft_token_ids) for index in guessing)
        drafts: dict[int, list[int]] = {index: [] for index in guessing}
        probs: dict[int, list[torch.Tensor]] = {index: [] for index in guessing}
        step_logits = {index: logits[index] for index in guessing}
        for j in range(k):
            for index in guessing:
                if j < len(rows[index].draft_token_ids):
                    token, dist = self._draw(rows[index], step_logits[index], generators)
                    drafts[index].append(token)
                    probs[index].append(dist)
            going = [i for i in guessing if j + 1 < len(rows[i].draft_token_ids)]
            if not going:
                break
            more = paged_forward(
                self.model,
                self.cache,
                [
                    PagedRow(
                        [drafts[i][-1]],
                        rows[i].start_position + 1 + j,
                        rows[i].request.block_table.block_ids,
                    )
                    for i in going
                ],
            )
            step_logits = dict(zip(going, more, strict=True))
        for index in guessing:
            row = rows[index]
            row.draft_token_ids[:] = drafts[index]
            if not row.request.params.greedy:
                self.probs[row.request.request_id] = torch.stack(probs[index])

    def _catch_up_row(self, row: ScheduledRow) -> PagedRow:
        """The draft's row: the request's tokens up to the row's drafts (which the draft
        guesses one at a time), from the row's start for a prefill, else from the end of the
        draft's last catch-up for the request. On a decode row that is the drafts the target
        kept at the step before and the token it added: the draft computed up to k - 1 of
        those kept drafts while guessing them and computes them again here, a known cost."""
        request = row.request
        end = row.end_position - len(row.draft_token_ids)
        start = row.start_position
        if not row.is_prefill:
            start = min(start, self._computed.get(request.request_id, start))
        return PagedRow(request.token_ids[start:end], start, request.block_table.block_ids)

    def _draw(
        self, row: ScheduledRow, logits: torch.Tensor, generators: Generators
    ) -> tuple[int, torch.Tensor | None]:
        """One guess from the draft's logits, with the row's logit bias (so a banned or forced
        token is guessed as the target will judge it): its argmax for a greedy row, else a
        draw from its distribution under the row's sampling parameters (returned, dense)."""
        params = row.request.params
        logits = apply_logit_bias(logits, params)
        if params.greedy:
            return int(logits.argmax()), None
        dense = dense_distribution(logits, params)
        return int(draw_one(dense, generators[row.request.request_id])), dense


def load_draft(path: str, target: Llama, target_cache: PagedKVCache) -> DraftModel:
    """The draft model in the checkpoint folder `path`, on the target's device and in its
    dtype ("packed" kernels: no start-up timing for the draft's many small row counts)."""
    if not Path(path).is_dir():
        raise ValueError(
            f"speculative={path!r} is neither 'ngram' nor a draft model's checkpoint folder"
        )
    parameter = next(target.parameters())
    draft = load_model(path, dtype=parameter.dtype, device=parameter.device, kernels="packed")
    return DraftModel(draft, target, target_cache)
