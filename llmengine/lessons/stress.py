"""The stress test: a burst through an engine, aborts on a script, integrity after every step.

The test worth trusting preemption to: many more requests than slots through a pool small
enough to preempt constantly, long enough that a request is evicted and resumed several times,
checking that the text never changes, that no block goes missing and that
every slot comes back. `run_stress` drives any engine that way (the engine's keyword
arguments pass straight through, so the same script runs under any policy or preemption
mode) and keeps what the lesson plots and the tests check: the pool at every step, each
request's evictions, the aborts with the state they caught their request in, and the tokens
both as each step delivered them and as the engine recorded them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from llmengine.bench.workloads import RequestSpec
from llmengine.engine import Engine
from llmengine.kv.blocks import blocks_for_length
from llmengine.model.llama import Llama
from llmengine.outcome import IterationOutcome
from llmengine.scheduling.request import Request, RequestState

PREEMPTED = "preempted"


def lifecycle_state(request: Request) -> str:
    """The request's state by name, a queued request that was evicted before called "preempted".

    The engine keeps both kinds of queued request in one state; an abort script has to tell
    them apart, since aborting one that holds nothing and one that used to hold K/V are
    different cases.
    """
    if request.state is RequestState.WAITING and request.num_preemptions > 0:
        return PREEMPTED
    return request.state.value


@dataclass(frozen=True, slots=True)
class ScriptedAbort:
    """Abort the lowest-numbered request in `state` before forward `step` (1 is the first).

    When no request is in that state then, the abort waits for the first later step at which
    one is; a script whose abort never finds its state is an error, not a quiet pass.
    """

    step: int
    state: str


@dataclass(frozen=True, slots=True)
class AbortRecord:
    """One abort as it happened: whom (workload index), in which state, before which forward."""

    index: int
    state: str
    step: int
    tokens_generated: int


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """The pool and the queue at one step: held during its forward, free once it returned."""

    step: int
    held_blocks: int
    free_blocks: int
    running: int
    queued: int
    evicted: int


@dataclass(slots=True)
class StressRun:
    """Everything one stress run recorded, in workload order where it is per request.

    `outputs[i]` is what the engine recorded for request i (at its finish, or at its abort);
    `streamed[i]` is what the steps delivered for it, one token per step it was in, which is
    what a client reading the stream saw. They agree when resumption is right.
    """

    engine: Engine
    request_ids: list[int]
    outcomes: list[IterationOutcome] = field(default_factory=list)
    snapshots: list[PoolSnapshot] = field(default_factory=list)
    aborts: list[AbortRecord] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)
    streamed: list[list[int]] = field(default_factory=list)
    evictions: list[int] = field(default_factory=list)

    @property
    def num_steps(self) -> int:
        return len(self.outcomes)

    @property
    def num_evictions(self) -> int:
        return sum(self.evictions)

    @property
    def num_resumes(self) -> int:
        """Prefills that brought an evicted request back."""
        return sum(len(outcome.resumed) for outcome in self.outcomes)

    @property
    def aborted(self) -> set[int]:
        """Workload indices of the aborted requests."""
        return {record.index for record in self.aborts}

    @property
    def survivors(self) -> list[int]:
        """Workload indices of the requests that ran to their finish."""
        return [index for index in range(len(self.request_ids)) if index not in self.aborted]

    @property
    def blocks_back(self) -> bool:
        """Every block of the pool is free again."""
        return self.engine.num_free_blocks == self.engine.num_blocks

    @property
    def slots_back(self) -> bool:
        """No request holds a slot any more."""
        return self.engine.num_running == 0

    def differing(self, reference: Sequence[Sequence[int]]) -> list[int]:
        """Survivors whose recorded tokens are not `reference`'s for the same request."""
        return [i for i in self.survivors if self.outputs[i] != list(reference[i])]

    def aborted_prefixes_hold(self, reference: Sequence[Sequence[int]]) -> bool:
        """Each aborted request had generated the start of its reference text, nothing else."""
        return all(
            list(reference[i][: len(self.outputs[i])]) == self.outputs[i] for i in self.aborted
        )


def pool_for_everyone(workload: Sequence[RequestSpec], block_size: int) -> int:
    """Blocks for every request's worst case at once: a pool in which nobody is ever evicted."""
    return sum(
        blocks_for_length(len(spec.prompt_token_ids) + spec.params.max_tokens, block_size)
        for spec in workload
    )


def run_stress(
    model: Llama,
    workload: Sequence[RequestSpec],
    aborts: Sequence[ScriptedAbort] = (),
    *,
    engine_class: type[Engine] = Engine,
    **engine_kwargs: Any,
) -> StressRun:
    """Send `workload` as one burst through `engine_class(model, **engine_kwargs)` to the end.

    Before each forward the due aborts run (each checked by `check_integrity`), then the step,
    then `check_integrity` again: a broken invariant raises AssertionError at the step that
    broke it. Raises ValueError for a spec that arrives after the burst, RuntimeError for an
    abort whose state never came.
    """
    if any(spec.arrival for spec in workload):
        raise ValueError("run_stress sends one burst: every spec must arrive at 0")
    engine = engine_class(model, **engine_kwargs)
    ids = [engine.add_request(list(spec.prompt_token_ids), spec.params) for spec in workload]
    run = StressRun(engine, ids)
    pending = sorted(aborts, key=lambda plan: plan.step)
    while engine.has_unfinished():
        step = run.num_steps + 1
        for plan in [plan for plan in pending if plan.step <= step]:
            if _abort_one(engine, ids, plan.state, step, run.aborts):
                pending.remove(plan)
        if not engine.has_unfinished():
            break
        outcome = engine.step()
        engine.check_integrity()
        run.outcomes.append(outcome)
        states = [lifecycle_state(engine.request(request_id)) for request_id in ids]
        run.snapshots.append(
            PoolSnapshot(
                step=step,
                held_blocks=outcome.held_blocks,
                free_blocks=engine.num_free_blocks,
                running=states.count(RequestState.RUNNING.value),
                queued=states.count(RequestState.WAITING.value) + states.count(PREEMPTED),
                evicted=len(outcome.evicted),
            )
        )
    if pending:
        unmet = ", ".join(f"{plan.state} from step {plan.step}" for plan in pending)
        raise RuntimeError(f"scripted aborts never found their request: {unmet}")
    run.outputs = [engine.request(request_id).output_token_ids for request_id in ids]
    run.streamed = [[] for _ in ids]
    position = {request_id: index for index, request_id in enumerate(ids)}
    run.evictions = [0] * len(ids)
    for outcome in run.outcomes:
        for request_id, token in outcome.tokens.items():
            run.streamed[position[request_id]].append(token)
        for request_id in outcome.evicted:
            run.evictions[position[request_id]] += 1
    return run


def _abort_one(
    engine: Engine, ids: list[int], state: str, step: int, records: list[AbortRecord]
) -> bool:
    """Abort the lowest-numbered request in `state`, if any; record it and check the engine."""
    for index, request_id in enumerate(ids):
        request = engine.request(request_id)
        if lifecycle_state(request) == state:
            tokens_generated = request.num_output_tokens
            if not engine.abort(request_id):
                raise AssertionError(f"abort of {state} request {request_id} stopped nothing")
            engine.check_integrity()
            records.append(AbortRecord(index, state, step, tokens_generated))
            return True
    return False


def first_divergence(tokens: Sequence[int], reference: Sequence[int]) -> int | None:
    """The first position where two token lists differ, a missing token included, or None."""
    for position, (token, expected) in enumerate(zip(tokens, reference, strict=False)):
        if token != expected:
            return position
    if len(tokens) != len(reference):
        return min(len(tokens), len(reference))
    return None
