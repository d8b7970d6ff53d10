"""A step's forward, prepared before anything runs, and the rows whose faults it isolates.

The runner (`ModelRunner.run`) hands each step's scheduled rows here first. `StepPreparer`
turns them into a `ForwardPlan` (the rows as the paged forward takes them, the decision's
swaps, the decode graph's bucket or why the step runs eager, and the packed positions whose
logits prompt logprobs and draft checks need) and the plan's inputs (`packed_inputs`, or the
decode graph's). Every input is built here, before the forward, so that a fault in one row's
data surfaces while the rows are still apart: the rows are prepared together, and only when
that raises one by one (`rows_that_prepare`), which tells whose row to leave out, together
with the rows that would read the K/V a left-out row was to write. This sits apart from the
runner's step because it is pure preparation: it runs no forward and samples nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from llmengine.kv.paged_cache import PagedKVCache
from llmengine.outcome import DECODE_GRAPH, EAGER, EAGER_DRAFTS, EAGER_NO_BUCKET, EAGER_PREFILL
from llmengine.prompt_logprobs import LogitsPlan, PromptLogprobs
from llmengine.runner.attention import PagedRow
from llmengine.runner.cuda_graphs import StaticDecodeGraphs
from llmengine.runner.flex_inputs import DecodeInputs
from llmengine.runner.forward import PackedInputs, packed_inputs
from llmengine.runner.graphs import DecodeGraphs
from llmengine.runner.step_buffers import StepBuffers
from llmengine.scheduling.decision import (
    ScheduledRow,
    SchedulerOutput,
    packed_starts,
    readers_of_left_out,
)
from llmengine.speculative.verify import draft_logits_at

if TYPE_CHECKING:  # the overlap runs plans this module makes: a type here, no import cycle
    from llmengine.runner.overlap import OverlappedPreparer

# A plan's inputs: the eager forward's, the compiled graph's, or the captured graph's buffers.
Inputs = PackedInputs | DecodeInputs | StepBuffers


@dataclass(frozen=True, slots=True)
class ForwardPlan:
    """One forward, as every rank runs it: the rows, the swaps before it, the decode graph's
    bucket (None: eager), and the packed positions whose logits are wanted (None: each
    row's last)."""

    rows: list[PagedRow]
    blocks_to_swap_out: list[tuple[int, int]]
    blocks_to_swap_in: list[tuple[int, int]]
    bucket: int | None = None
    logits_at: list[int] | None = None
    path: str = EAGER


class Prepared(NamedTuple):
    """A step's forward, ready to run: its plan, its inputs (None: no row to compute), the
    prompt logprobs' share of its logits and how many of them check drafts (the last)."""

    plan: ForwardPlan
    inputs: Inputs | None
    logits_plan: LogitsPlan | None
    num_drafts: int


class StepPreparer:
    """Plans and prepares each step's forward over `cache`, routing decode steps to `graphs`
    (None: always eager) and reserving the logits `prompt_logprobs` owes. With `overlap`,
    an eager forward's inputs are the ones it built during the last forward when its guess
    of the rows was right (`OverlappedPreparer.inputs`)."""

    def __init__(
        self,
        cache: PagedKVCache,
        graphs: DecodeGraphs | StaticDecodeGraphs | None,
        prompt_logprobs: PromptLogprobs,
        overlap: OverlappedPreparer | None = None,
    ) -> None:
        self.cache = cache
        self.graphs = graphs
        self.prompt_logprobs = prompt_logprobs
        self.overlap = overlap

    def prepare(self, rows: list[ScheduledRow], decision: SchedulerOutput) -> Prepared:
        """The forward's plan for `rows`, and its inputs (`packed_inputs` or the decode
        graph's), built before anything runs: a fault here is one of the rows' data."""
        plan, logits_plan, num_drafts = self._plan(rows, decision)
        if not plan.rows:
            return Prepared(plan, None, logits_plan, num_drafts)
        if plan.bucket is not None:
            assert self.graphs is not None
            inputs = self.graphs.inputs_for(plan.rows, plan.bucket)
            return Prepared(plan, inputs, logits_plan, num_drafts)
        if self.overlap is not None:
            return Prepared(plan, self.overlap.inputs(plan.rows), logits_plan, num_drafts)
        return Prepared(plan, packed_inputs(self.cache, plan.rows), logits_plan, num_drafts)

    def rows_that_prepare(
        self, decision: SchedulerOutput, failed: dict[int, str]
    ) -> tuple[list[ScheduledRow], list[int]]:
        """The rows whose inputs prepare, each prepared alone, and the requests the forward
        leaves out: those whose row raises (failed with why), and those whose row would read
        K/V a left-out row was to write, a prefix-cache hit in the same decision (failed
        too: their K/V would be garbage)."""
        left_out: dict[int, str] = {}
        for row in decision.rows:
            try:
                self.prepare([row], decision)
            except Exception as error:
                left_out[row.request.request_id] = f"preparing its inputs failed: {error}"
        readers = readers_of_left_out(decision, left_out, self.cache.block_size)
        for request_id, owner in readers.items():
            left_out[request_id] = (
                f"its cached prefix was to be computed by request {owner}, whose inputs failed"
            )
        for request_id, reason in left_out.items():
            failed.setdefault(request_id, reason)
        rows = [row for row in decision.rows if row.request.request_id not in left_out]
        return rows, list(left_out)

    def _plan(
        self, scheduled: list[ScheduledRow], decision: SchedulerOutput
    ) -> tuple[ForwardPlan, LogitsPlan | None, int]:
        """The forward's plan for the `scheduled` rows of `decision` (its swaps), the prompt
        logprobs' share of its logits (None: no row owes any) and how many of its logits
        check drafts (the last ones)."""
        rows = [paged_row(row) for row in scheduled]
        swaps = (decision.blocks_to_swap_out, decision.blocks_to_swap_in)
        if not rows:
            return ForwardPlan(rows, *swaps), None, 0
        bucket, path = self._route(scheduled)
        if bucket is not None:
            return ForwardPlan(rows, *swaps, bucket=bucket, path=path), None, 0
        logits_plan = self.prompt_logprobs.plan(scheduled)
        drafts_at = draft_logits_at(scheduled)
        if logits_plan is None and not drafts_at:
            return ForwardPlan(rows, *swaps, path=path), None, 0
        last_positions = [end - 1 for end in packed_starts(scheduled)[1:]]
        logits_at = last_positions if logits_plan is None else logits_plan.logits_at
        plan = ForwardPlan(rows, *swaps, logits_at=logits_at + drafts_at, path=path)
        return plan, logits_plan, len(drafts_at)

    def _route(self, rows: list[ScheduledRow]) -> tuple[int | None, str]:
        """The decode graph's bucket for these rows and `DECODE_GRAPH`, or None and why the
        step runs eager: no graphs, a prefill or chunk among the rows, a row with drafts, or
        no kept bucket that holds them all."""
        if self.graphs is None:
            return None, EAGER
        if any(row.is_prefill for row in rows):
            return None, EAGER_PREFILL
        if any(row.num_positions != 1 for row in rows):
            return None, EAGER_DRAFTS
        bucket = self.graphs.graph_for(len(rows))
        return bucket, DECODE_GRAPH if bucket is not None else EAGER_NO_BUCKET


def paged_row(row: ScheduledRow) -> PagedRow:
    """A scheduled row as the paged forward takes it: new tokens, where they start, its blocks."""
    return PagedRow(row.token_ids, row.start_position, row.request.block_table.block_ids)
