"""The three rules of the scheduler a lesson may change, and what each one decides.

`Scheduler` inherits them; a subclass that overrides one runs the rest of the scheduler
unchanged, on the real model (lesson 13's lookahead, lesson 15's wrong resumes, lesson 16's
victim rules). Each rule reads only what it is given and the configuration.
"""

from __future__ import annotations

from llmengine.engine_config import EngineConfig
from llmengine.scheduling.decision import ScheduledRow
from llmengine.scheduling.request import Request


class SchedulingRules:
    """Who gives way, how a prefill is cut, and what an admission must leave free."""

    config: EngineConfig

    def free_blocks_to_keep(self) -> int:
        """Free blocks an admission or a swap-in must leave in the pool: the watermark.
        Growth may spend them; only newcomers are refused."""
        return self.config.watermark

    def select_victim(self, candidates: list[Request]) -> Request:
        """Whom to preempt when growth finds the pool dry: the youngest candidate.

        `candidates` are the running requests, oldest first, from the one that needs a block
        to the youngest. Seniority is what makes growth terminate: the oldest running request
        is never a victim, so it always reaches its last token and frees its blocks.
        """
        return candidates[-1]

    def prefill_row(self, request: Request, max_positions: int | None = None) -> ScheduledRow:
        """The next chunk of `request`'s prefill, at most `max_positions` (None: all the rest):
        resume, not restart (`ScheduledRow.prefill_chunk`)."""
        return ScheduledRow.prefill_chunk(request, max_positions)
