"""An engine's guesser, whichever proposer it is, before the step is scheduled.

Before `schedule()`, `propose` gives each decoding request that may speculate its drafts:
prompt lookup's guesses, or room for a draft model's, which the model runner's draft model
fills once the rows are decided (`llmengine.runner.draft`). Off (`speculative=None`) it does
nothing at all. A request whose guess raises goes on without drafts.
"""

from __future__ import annotations

from collections.abc import Iterable

from llmengine.engine_config import EngineConfig
from llmengine.scheduling.request import Request
from llmengine.speculative.ngram import propose_ngram
from llmengine.speculative.verify import can_speculate


class Speculator:
    """The proposer an `EngineConfig` names: none, "ngram", or a draft model's folder."""

    def __init__(self, config: EngineConfig) -> None:
        self.enabled = config.speculative is not None
        self.k = config.num_speculative_tokens
        self.by_draft_model = config.speculative not in (None, "ngram")

    def propose(self, running: Iterable[Request]) -> None:
        """Drafts (or room for them) for every decoding request that may speculate; the
        scheduler cuts them to what the request's budget and the step's leave."""
        if not self.enabled:
            return
        for request in running:
            if not request.prefilling and can_speculate(request.params, request.num_output_tokens):
                if self.by_draft_model:
                    request.draft_token_ids = [0] * self.k  # the draft model's places
                    continue
                try:
                    request.draft_token_ids = propose_ngram(request.token_ids, self.k)
                except Exception:
                    # Drafts decide how fast a request goes, never what it gets: a guess
                    # that raises costs its request this step's drafts, not its answer.
                    request.draft_token_ids = []
