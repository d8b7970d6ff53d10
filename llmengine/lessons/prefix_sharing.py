"""Reading a run under prefix caching: what each prefill took, and what a victim's blocks lived.

An `IterationOutcome` reports the cache hits of a whole step (`cached_tokens`); lesson 21 wants
them per admission, to see which request shared which prompt and which victim found its own
blocks again on resuming. `admissions` reads them from the outcomes alone, the way batchbench
reads a run: an admission's sequence is its prompt plus the tokens it had generated before, its
prefill row computed `row_positions` of them, and the rest it took from the cache.

Why a victim found what it found is not in the outcomes: `VictimWatch` wraps the engine and,
after every step, looks up (by block id and key, changing nothing) how many of each absent
victim's full blocks are still cached.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmengine.bench.batchbench import WorkloadRun
from llmengine.bench.workloads import RequestSpec
from llmengine.sampling import SamplingParams

if TYPE_CHECKING:
    from llmengine.engine import Engine
    from llmengine.kv.prefix_cache import BlockKey
    from llmengine.outcome import IterationOutcome

# Lesson 21's shared "system prompt": the embedded model knows only Shakespeare.
SYSTEM_PROMPT = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
    "All:\nSpeak, speak.\n\n"
    "First Citizen:\nYou are all resolved rather to die than to famish?\n\n"
    "All:\nResolved. resolved.\n\n"
)
# What each request adds after it: the first line of a famous speech.
SPEECHES = (
    "ROMEO:\nBut soft, what light through yonder window breaks?",
    "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?",
    "HAMLET:\nTo be, or not to be, that is the question.",
    "KING LEAR:\nBlow, winds, and crack your cheeks! rage! blow!",
    "MACBETH:\nIs this a dagger which I see before me?",
    "PORTIA:\nThe quality of mercy is not strain'd.",
    "OTHELLO:\nIt is the cause, it is the cause, my soul.",
    "PROSPERO:\nOur revels now are ended.",
    "BRUTUS:\nThere is a tide in the affairs of men.",
    "ANTONY:\nFriends, Romans, countrymen, lend me your ears.",
    "HENRY V:\nOnce more unto the breach, dear friends, once more.",
    "ORSINO:\nIf music be the food of love, play on.",
    "RICHARD III:\nNow is the winter of our discontent.",
    "JAQUES:\nAll the world's a stage.",
    "MERCUTIO:\nA plague o' both your houses!",
    "GLOUCESTER:\nAs flies to wanton boys are we to the gods.",
)


def system_prompt_workload(
    tokenizer: Any, *, budgets: tuple[int, int] = (16, 32), seed: int = 21
) -> list[RequestSpec]:
    """One request per speech: `SYSTEM_PROMPT`'s ids (BOS first), then the speech's (no BOS).

    Joining ids rather than texts keeps the shared prefix the same ids in every prompt,
    whatever the tokenizer would merge at the seam. Budgets are drawn from `budgets`
    (inclusive) with `seed`; greedy, no early stop, so every request runs its whole budget.
    """
    system = tokenizer.encode(SYSTEM_PROMPT)
    drawn = random.Random(seed).choices(range(budgets[0], budgets[1] + 1), k=len(SPEECHES))
    return [
        RequestSpec(
            tuple(system + tokenizer.encode(speech, add_special_tokens=False)),
            SamplingParams(max_tokens=budget, temperature=0.0, ignore_eos=True),
        )
        for speech, budget in zip(SPEECHES, drawn, strict=True)
    ]


@dataclass(frozen=True, slots=True)
class Admission:
    """One prefill: request `index` (workload order) admitted in `iteration` (1-based).

    `tokens` is the sequence it had then, `computed` the positions its prefill row computed,
    `cached` the positions it took from the cache. A resumed victim has `evicted_in`, the
    iteration of the eviction it is coming back from; a fresh admission has None.
    """

    index: int
    iteration: int
    tokens: int
    computed: int
    evicted_in: int | None = None

    @property
    def cached(self) -> int:
        return self.tokens - self.computed

    @property
    def resumed(self) -> bool:
        return self.evicted_in is not None


def admissions(run: WorkloadRun, prompt_lens: list[int]) -> list[Admission]:
    """Every admission of `run`, in step order; `prompt_lens[i]` is request i's prompt length.

    Needs each prefill in one row (no `max_num_batched_tokens`): ValueError when a step's
    admissions do not add up to the `cached_tokens` it reported, which a chunked prefill or a
    prompt length that is not the run's would cause.
    """
    index_of = {request_id: index for index, request_id in enumerate(run.request_ids)}
    generated = dict.fromkeys(run.request_ids, 0)
    last_eviction: dict[int, int] = {}
    found: list[Admission] = []
    for iteration, outcome in enumerate(run.outcomes, start=1):
        for request_id in outcome.evicted:
            last_eviction[request_id] = iteration
        step = []
        for request_id in outcome.admitted:
            step.append(
                Admission(
                    index_of[request_id],
                    iteration,
                    prompt_lens[index_of[request_id]] + generated[request_id],
                    outcome.row_positions[request_id],
                    last_eviction.get(request_id) if request_id in outcome.resumed else None,
                )
            )
        if sum(admission.cached for admission in step) != outcome.cached_tokens:
            raise ValueError(
                f"iteration {iteration}: the admissions took "
                f"{sum(admission.cached for admission in step)} positions from the cache but "
                f"the step reported {outcome.cached_tokens}: a chunked prefill?"
            )
        found += step
        for request_id in outcome.tokens:
            generated[request_id] += 1
    return found


@dataclass(slots=True)
class Absence:
    """One victim's time away under prefix caching: what happened to its full blocks.

    `full_blocks` it had filled when evicted in `evicted_in`; `left_after_eviction` of them
    were still cached once that step's growth had taken what it needed, and
    `left_before_return` once the step before its return was over (None while it is away).
    """

    request_id: int
    evicted_in: int
    full_blocks: int
    left_after_eviction: int
    left_before_return: int | None = None
    back_in: int | None = None


class VictimWatch:
    """An `Engine` with prefix caching, stepped as usual, that follows each victim's blocks.

    It gives batchbench's runner what it needs (`add_request`, `step`, `has_unfinished`), so
    `run_workload(VictimWatch(engine), workload)` runs the same schedule as the bare engine.
    After every step it counts, for each victim away, the leading run of its full blocks
    still cached under the key it left them with: the run a lookup would find now.
    """

    def __init__(self, engine: Engine) -> None:
        if not engine.config.enable_prefix_caching:
            raise ValueError("VictimWatch follows cached blocks: the engine needs prefix caching")
        self.engine = engine
        self.absences: list[Absence] = []
        self._away: dict[int, tuple[Absence, list[tuple[int, BlockKey]]]] = {}

    def add_request(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> int:
        return self.engine.add_request(prompt_token_ids, params)

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()

    def _still_cached(self, blocks: list[tuple[int, BlockKey]]) -> int:
        pool = self.engine.scheduler.pool
        count = 0
        for block_id, key in blocks:
            if pool.key_of(block_id) is not key:
                break
            count += 1
        return count

    def step(self) -> IterationOutcome:
        pool = self.engine.scheduler.pool
        before = {rid: self._still_cached(blocks) for rid, (_, blocks) in self._away.items()}
        keyed = {
            request.request_id: [
                (block_id, key)
                for block_id in request.block_table.block_ids
                if (key := pool.key_of(block_id)) is not None
            ]
            for request in self.engine.scheduler.running
        }
        outcome = self.engine.step()
        number = self.engine.iteration
        for request_id in outcome.evicted:
            blocks = keyed[request_id]
            absence = Absence(request_id, number, len(blocks), self._still_cached(blocks))
            self.absences.append(absence)
            self._away[request_id] = (absence, blocks)
        for request_id in outcome.admitted:
            if request_id in self._away:
                absence, _ = self._away.pop(request_id)
                absence.left_before_return = before.get(request_id, absence.left_after_eviction)
                absence.back_in = number
        return outcome
