"""Victim rules other than the youngest, and a driver that runs a scheduler until it loops.

Lesson 16 swaps `Scheduler.select_victim` and watches what the scheduler does on plain
integers, with a fake forward that samples token 7 for every row. The rules here are
deliberately not the core's: evict the largest candidate, evict the oldest one, and the
restart bug (a victim loses the tokens it generated), each a `Scheduler` subclass so the
core keeps one rule and no switch.

The driver records the scheduler's whole state after every step. The scheduler is
deterministic and its decisions read only counts (tokens, blocks, free slots, queue order),
never which block ids a request holds, so a state seen twice means the steps between the two
sightings repeat forever: a livelock, detected instead of waited for. The states are finitely
many (tokens are bounded by the budgets, blocks by the pool), so every run ends one way or
the other.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from llmengine.kv.blocks import blocks_for_length
from llmengine.params import SamplingParams
from llmengine.scheduling.request import Request
from llmengine.scheduling.scheduler import Scheduler

FAKE_TOKEN = 7  # what the fake forward samples for every row

# -- the rules ---------------------------------------------------------------------------


class EvictLargest(Scheduler):
    """Evict the candidate holding the most blocks; among equals, the youngest.

    Ties go to the youngest so that the rule departs from the core's only where sizes
    differ: every difference in outcome is then the size rule's doing.
    """

    def select_victim(self, candidates: list[Request]) -> Request:
        return max(candidates, key=lambda r: (len(r.block_table.block_ids), r.arrival))


class EvictOldest(Scheduler):
    """Evict the oldest candidate: the request asking for the block gives way itself.

    The running list is kept in seniority order and the candidates start with the asker, so
    the first candidate is both.
    """

    def select_victim(self, candidates: list[Request]) -> Request:
        return candidates[0]


class RestartOnEviction(Scheduler):
    """The restart bug: a victim loses the tokens it generated along with its K/V.

    Lesson 13's wrong version of preemption, kept here to show what resume protects. The
    victim is chosen by the next rule in the method resolution order (the core's youngest
    when used alone), then cut back to its prompt before the core preempts it, so it waits
    and comes back as the size of its prompt, as a fresh request would. (`wrong_resumes`
    restarts at readmission instead, after the blocks for the whole sequence were bought:
    the text goes wrong, but the pool still sees the request at its full size.)
    """

    def select_victim(self, candidates: list[Request]) -> Request:
        victim = super().select_victim(candidates)
        del victim.token_ids[len(victim.prompt_token_ids) :]
        return victim


class RestartYoungest(RestartOnEviction):
    """The youngest candidate is evicted and restarts from its prompt."""


class RestartLargest(RestartOnEviction, EvictLargest):
    """The largest candidate is evicted and restarts from its prompt."""


class RestartOldest(RestartOnEviction, EvictOldest):
    """The oldest candidate is evicted and restarts from its prompt."""


class EvictLargestOfAll(Scheduler):
    """Evict the largest *running* request, ignoring the candidate list the core passes.

    Shows why the core restricts the candidates: a request older than the one asking has
    already been granted this step's block and its row, and evicting it takes back blocks
    its row in this very forward is about to write.
    """

    def select_victim(self, candidates: list[Request]) -> Request:
        return max(self.running, key=lambda r: (len(r.block_table.block_ids), r.arrival))


RESUME_RULES: dict[str, type[Scheduler]] = {
    "youngest": Scheduler,
    "largest": EvictLargest,
    "oldest": EvictOldest,
}
RESTART_RULES: dict[str, type[Scheduler]] = {
    "youngest": RestartYoungest,
    "largest": RestartLargest,
    "oldest": RestartOldest,
}

# -- the driver --------------------------------------------------------------------------


def make_requests(specs: Iterable[tuple[int, int]], block_size: int) -> list[Request]:
    """Requests from (prompt length, budget) pairs, in arrival order, running to their budget."""
    return [
        Request(
            request_id=index,
            prompt_token_ids=[1] * prompt_len,
            params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
            arrival=index,
            block_size=block_size,
        )
        for index, (prompt_len, max_tokens) in enumerate(specs)
    ]


State = tuple[tuple[tuple[str, int, int], ...], tuple[int, ...], tuple[int, ...]]


def scheduler_state(scheduler: Scheduler, requests: list[Request]) -> State:
    """Everything the scheduler's next decisions depend on, as a hashable value.

    Per request its state, tokens generated and blocks held; then the waiting queue and the
    running list in order. Free blocks and free slots follow from these.
    """
    per_request = tuple(
        (r.state.value, r.num_output_tokens, len(r.block_table.block_ids)) for r in requests
    )
    waiting = tuple(r.request_id for r in scheduler.waiting)
    running = tuple(r.request_id for r in scheduler.running)
    return per_request, waiting, running


@dataclass(slots=True, frozen=True)
class Eviction:
    """One call of the victim rule: who needed a block, whom it evicted, and whether alone."""

    asker: int
    victim: int
    alone: bool  # the asker was the only running request: it had evicted everybody else


@dataclass(slots=True, frozen=True)
class Step:
    """One call of `schedule()` and `update()`, seen from outside the scheduler."""

    number: int  # 1-based
    rows: tuple[int, ...]  # request ids in the forward, in row order
    evictions: tuple[Eviction, ...]  # in the order they happened
    held: tuple[int, ...]  # blocks each request holds after the step, by request id
    generated: tuple[int, ...]  # tokens each request has kept after the step
    recomputed: int  # positions of resumed prefills in this forward
    # Decode rows of requests evicted while this forward was built: each row's K/V would land
    # in blocks the scheduler had already handed to someone else.
    orphan_rows: tuple[int, ...] = ()

    @property
    def evicted(self) -> tuple[int, ...]:
        return tuple(eviction.victim for eviction in self.evictions)


@dataclass(slots=True)
class Trace:
    """One run, from its first step until it drained, repeated a state or orphaned a row."""

    steps: list[Step] = field(default_factory=list)
    drained: bool = False
    first_seen: int | None = None  # the step after which the repeated state was first seen
    repeated_at: int | None = None  # the step after which it was seen again
    finished_at: dict[int, int] = field(default_factory=dict)  # request id -> its last step

    @property
    def livelocked(self) -> bool:
        return self.repeated_at is not None

    @property
    def cycle_length(self) -> int | None:
        """Steps in the loop that repeats forever, or None for a run that did not loop."""
        if self.repeated_at is None or self.first_seen is None:
            return None
        return self.repeated_at - self.first_seen

    @property
    def evictions(self) -> list[Eviction]:
        return [eviction for step in self.steps for eviction in step.evictions]

    @property
    def tokens_sampled(self) -> int:
        """Tokens the fake forward produced, kept or later thrown away."""
        return sum(len(step.rows) for step in self.steps)

    @property
    def tokens_kept(self) -> int:
        return sum(self.steps[-1].generated) if self.steps else 0

    @property
    def recomputed(self) -> int:
        return sum(step.recomputed for step in self.steps)

    @property
    def lone_self_evictions(self) -> int:
        """Evictions in which a request alone in the pool evicted itself.

        It had evicted everybody else and still did not fit: the pool it was alone with was
        too small for its next token, the case the door check rules out.
        """
        return sum(e.alone and e.asker == e.victim for e in self.evictions)

    def evictions_of(self, request_id: int) -> int:
        return sum(eviction.victim == request_id for eviction in self.evictions)


def _listen_to_victim_rule(scheduler: Scheduler) -> list[Eviction]:
    """Wrap this scheduler's `select_victim` so that every call is recorded, then return the log.

    The rule's candidates start with the request that needs the block, so the asker is
    `candidates[0]` whatever the rule; the rule itself is called unchanged.
    """
    heard: list[Eviction] = []
    choose = scheduler.select_victim

    def choose_and_record(candidates: list[Request]) -> Request:
        victim = choose(candidates)
        heard.append(
            Eviction(candidates[0].request_id, victim.request_id, len(scheduler.running) == 1)
        )
        return victim

    scheduler.select_victim = choose_and_record
    return heard


def run_until_drained_or_repeated(
    scheduler: Scheduler,
    requests: list[Request],
    arrive_at: Sequence[int] | None = None,
    door: bool = True,
) -> Trace:
    """Step `scheduler` through `requests` until nothing is left or a state repeats.

    Request i arrives after `arrive_at[i]` steps (default: all before the first), through
    `add()` and its door check, or with `door=False` straight into the waiting queue: what
    the scheduler would face if the door let through a request whose worst case exceeds the
    empty pool. States are compared only once everybody has arrived, since until then the
    future also depends on who is still to come.

    The scheduler's integrity check runs after every step. A decision with an orphan row
    ends the run before its forward: that decision is the finding, and the row has no blocks
    left to write into.
    """
    arrive_at = [0] * len(requests) if arrive_at is None else list(arrive_at)
    heard = _listen_to_victim_rule(scheduler)
    trace = Trace()
    seen: dict[State, int] = {}
    while True:
        for request, arrival in zip(requests, arrive_at, strict=True):
            if arrival == len(trace.steps):
                if door:
                    scheduler.add(request)
                else:
                    scheduler.waiting.append(request)
        everybody_here = len(trace.steps) >= max(arrive_at, default=0)
        if everybody_here:
            state = scheduler_state(scheduler, requests)
            if state in seen:
                trace.first_seen, trace.repeated_at = seen[state], len(trace.steps)
                return trace
            seen[state] = len(trace.steps)
            if not scheduler.has_unfinished():
                trace.drained = True
                return trace
        heard.clear()
        out = scheduler.schedule()
        evicted = {request.request_id for request in out.preempted}
        rows = tuple(row.request.request_id for row in out.rows)
        # A victim may come back through admission in the same step, as a prefill row; a
        # decode row of a victim is the row it was granted before it was evicted.
        orphans = tuple(
            row.request.request_id
            for row in out.rows
            if not row.is_prefill and row.request.request_id in evicted
        )
        if not orphans:
            for request in scheduler.update(out, dict.fromkeys(rows, FAKE_TOKEN)):
                trace.finished_at[request.request_id] = len(trace.steps) + 1
        scheduler.check_integrity()
        trace.steps.append(
            Step(
                number=len(trace.steps) + 1,
                rows=rows,
                evictions=tuple(heard),
                held=tuple(len(r.block_table.block_ids) for r in requests),
                generated=tuple(r.num_output_tokens for r in requests),
                recomputed=sum(row.recomputed for row in out.rows),
                orphan_rows=orphans,
            )
        )
        if orphans:
            return trace


def run_rule(
    rule: type[Scheduler],
    specs: Sequence[tuple[int, int]],
    num_blocks: int,
    block_size: int,
    num_slots: int,
    door: bool = True,
    arrive_at: Sequence[int] | None = None,
) -> Trace:
    """Trace a fresh `rule` scheduler on requests built from (prompt length, budget) pairs."""
    scheduler = rule(num_blocks=num_blocks, block_size=block_size, num_slots=num_slots)
    requests = make_requests(specs, block_size)
    return run_until_drained_or_repeated(scheduler, requests, arrive_at, door)


# -- every small configuration ---------------------------------------------------------


@dataclass(slots=True, frozen=True)
class Config:
    """A small workload: requests as (prompt length, budget), a pool, a block size, slots."""

    specs: tuple[tuple[int, int], ...]
    num_blocks: int
    block_size: int
    num_slots: int

    def passes_the_door(self) -> bool:
        """Every request's worst case fits the empty pool: the rule `Scheduler.add` applies."""
        return all(
            blocks_for_length(prompt + budget, self.block_size) <= self.num_blocks
            for prompt, budget in self.specs
        )


def small_configs(
    num_requests: int = 2,
    block_sizes: Iterable[int] = (1, 2),
    max_blocks: int = 6,
    max_prompt: int = 3,
    max_budget: int = 5,
) -> list[Config]:
    """Every workload in these ranges, requests arriving together with a slot each.

    One slot per request leaves the pool as the only constraint, which is where victims are
    chosen.
    """
    shapes = list(itertools.product(range(1, max_prompt + 1), range(1, max_budget + 1)))
    return [
        Config(specs, num_blocks, block_size, num_requests)
        for block_size in block_sizes
        for num_blocks in range(1, max_blocks + 1)
        for specs in itertools.product(shapes, repeat=num_requests)
    ]


@dataclass(slots=True)
class SweepResult:
    """How one rule fared over a set of configurations."""

    configs: int = 0
    drained: int = 0
    livelocked: int = 0
    # Drained runs that took no more steps than the budgets have tokens: the bound that
    # holds whenever every step keeps at least one token.
    within_token_bound: int = 0
    example: Config | None = None  # the first livelocking configuration
    oldest_evicted: int = 0  # configurations in which the first arrival was ever a victim
    evictions: int = 0
    recomputed: int = 0
    lone_self_evictions: int = 0


def sweep_rule(rule: type[Scheduler], configs: list[Config], door: bool = True) -> SweepResult:
    """Run `rule` on every configuration (through the door or past it) and tally the runs."""
    result = SweepResult()
    for config in configs:
        trace = run_rule(
            rule, config.specs, config.num_blocks, config.block_size, config.num_slots, door
        )
        result.configs += 1
        if trace.drained:
            result.drained += 1
            result.within_token_bound += len(trace.steps) <= sum(b for _, b in config.specs)
        elif trace.livelocked:
            result.livelocked += 1
            if result.example is None:
                result.example = config
        result.oldest_evicted += trace.evictions_of(0) > 0
        result.evictions += len(trace.evictions)
        result.recomputed += trace.recomputed
        result.lone_self_evictions += trace.lone_self_evictions
    return result
