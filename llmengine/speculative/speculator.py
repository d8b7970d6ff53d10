"""An engine's guesser, whichever proposer it is, through the step.

Before `schedule()`, `propose` gives each decoding request that may speculate its drafts:
prompt lookup's guesses, or room for a draft model's. Once the rows are decided and the
cache's swaps are done, `before_forward` lets a draft model mirror the swaps in its own
cache and fill the room it was given. Off (`speculative=None`) it does nothing at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from llmengine.engine_config import EngineConfig
from llmengine.kv.paged_cache import PagedKVCache
from llmengine.model.llama import Llama
from llmengine.scheduling.decision import SchedulerOutput
from llmengine.scheduling.request import Request
from llmengine.speculative.draft import DraftModel, load_draft
from llmengine.speculative.ngram import propose_ngram
from llmengine.speculative.verify import can_speculate


class Speculator:
    """The proposer an `EngineConfig` names: none, "ngram", or a draft model's folder."""

    def __init__(self, config: EngineConfig, model: Llama, cache: PagedKVCache) -> None:
        self.enabled = config.speculative is not None
        self.k = config.num_speculative_tokens
        self.drafter: DraftModel | None = None
        if config.speculative not in (None, "ngram"):
            self.drafter = load_draft(config.speculative, model, cache)

    def propose(self, running: Iterable[Request]) -> None:
        """Drafts (or room for them) for every decoding request that may speculate; the
        scheduler cuts them to what the request's budget and the step's leave."""
        if not self.enabled:
            return
        for request in running:
            if not request.prefilling and can_speculate(request.params):
                if self.drafter is None:
                    request.draft_token_ids = propose_ngram(request.token_ids, self.k)
                else:
                    request.draft_token_ids = [0] * self.k  # the draft model's places

    def before_forward(
        self, decision: SchedulerOutput, generators: Mapping[int, torch.Generator | None]
    ) -> None:
        """A draft model's share of the step: the decision's swaps in its cache, then its
        guesses in the rows' places."""
        if self.drafter is not None:
            self.drafter.cache.swap(decision.blocks_to_swap_out, decision.blocks_to_swap_in)
            self.drafter.propose(decision.rows, generators)

    @property
    def draft_probs(self) -> Mapping[int, torch.Tensor]:
        """The distributions this step's sampled rows' drafts were drawn from, by request."""
        return {} if self.drafter is None else self.drafter.probs

    def forget(self, request_id: int) -> None:
        if self.drafter is not None:
            self.drafter.forget(request_id)
