"""Static batching: the baseline continuous batching replaced (Day 29).

A static batch takes up to `num_slots` waiting requests, pads their prompts into one
rectangle, and computes every row of it in every forward until its longest request is done.
Nobody joins a batch once it has started, and nobody leaves it early: a request that finished
in the fourth forward keeps its row, and its answer comes back with everybody else's when the
last row is done, which is how a one-call `generate` over a padded batch behaves.

The runner writes one `IterationOutcome` per forward, the same record the engine writes, so
`ContinuousTiming` measures both with one piece of arithmetic. What a rectangle computes
only to stay rectangular is reported as `padded_tokens`: the pad after each short prompt in
the prefill, then one position per decode row whose request is already done. Those rows also
count in `rows` without a token, which is what `waste_fraction` charges.

The K/V lives in a `ContiguousKVCache`, one row per request. The prompts are right-padded,
so in the prefill every real position sees only its own prompt (the causal mask hides the
pad after it); afterwards each row's length is cut back to its prompt, and the first decoded
token overwrites the pad's K/V.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence

import torch

from llmengine.bench.batchbench import WorkloadRun
from llmengine.bench.clocks import Clock, IterationClock
from llmengine.bench.timing import Arrival
from llmengine.bench.workloads import RequestSpec
from llmengine.kv.contiguous_cache import ContiguousKVCache, contiguous_forward
from llmengine.model.llama import Llama
from llmengine.outcome import IterationOutcome, PoolShape
from llmengine.sampling import finish_reason, make_generator, sample_tokens

PAD_TOKEN_ID = 0  # any id works: no real position ever attends to a pad position


def run_static_batches(
    model: Llama,
    workload: Sequence[RequestSpec],
    *,
    num_slots: int,
    clock: Clock | None = None,
) -> WorkloadRun:
    """Run `workload` one static batch at a time (default clock: one unit per forward).

    A batch starts when the previous one is done and takes, in arrival order, up to
    `num_slots` requests that have arrived by then; an idle runner waits for the next
    arrival. Request ids are positions in `workload`.
    """
    if num_slots < 1:
        raise ValueError(f"num_slots must be at least 1, got {num_slots}")
    clock = IterationClock() if clock is None else clock
    clock.start()
    due = deque(sorted(range(len(workload)), key=lambda index: workload[index].arrival))
    queue: deque[int] = deque()
    run = WorkloadRun([], [], {}, list(range(len(workload))), [[] for _ in workload])

    def take_arrivals() -> None:
        while due and workload[due[0]].arrival <= clock.now():
            index = due.popleft()
            run.arrivals[index] = Arrival(iteration=len(run.outcomes), time=workload[index].arrival)
            queue.append(index)

    while due or queue:
        take_arrivals()
        if not queue:
            clock.wait_until(workload[due[0]].arrival)
            continue
        batch = [queue.popleft() for _ in range(min(num_slots, len(queue)))]
        for outcome in run_rectangle(model, workload, batch, num_slots, len(run.outcomes)):
            clock.tick()
            run.outcomes.append(outcome)
            run.times.append(clock.now())
            for request_id, token in outcome.tokens.items():
                run.outputs[request_id].append(token)
            take_arrivals()
    return run


@torch.inference_mode()
def run_rectangle(
    model: Llama,
    workload: Sequence[RequestSpec],
    batch: Sequence[int],
    num_slots: int,
    first_iteration: int = 0,
) -> Iterator[IterationOutcome]:
    """One static batch: the requests `batch` (indices into `workload`), one outcome per forward.

    The first forward is the padded prefill; every later one decodes all rows, finished or
    not, until the last request is done, and that forward reports the whole batch finished.
    """
    specs = [workload[index] for index in batch]
    prompts = [list(spec.prompt_token_ids) for spec in specs]
    width = max(len(prompt) for prompt in prompts)
    parameter = next(model.parameters())
    cache = ContiguousKVCache(
        model.config,
        len(specs),
        width + max(spec.params.max_tokens for spec in specs),
        dtype=parameter.dtype,
        device=parameter.device,
    )
    generators = [make_generator(spec.params, parameter.device) for spec in specs]
    pool = PoolShape(num_slots=num_slots)
    rectangle = [prompt + [PAD_TOKEN_ID] * (width - len(prompt)) for prompt in prompts]
    logits = contiguous_forward(model, cache, torch.tensor(rectangle, device=parameter.device))
    last_real = torch.tensor([len(prompt) - 1 for prompt in prompts], device=parameter.device)
    next_logits = logits[torch.arange(len(prompts), device=parameter.device), last_real]
    for row, prompt in enumerate(prompts):
        cache.lengths[row] = len(prompt)  # forget the pad: the next token overwrites its K/V
    forward_tokens = sum(len(prompt) for prompt in prompts)
    padded_tokens = len(prompts) * width - forward_tokens
    live = list(range(len(specs)))
    generated: list[list[int]] = [[] for _ in specs]
    iteration = first_iteration
    while True:
        prefill = iteration == first_iteration
        outcome = IterationOutcome(
            iteration=iteration,
            rows=len(specs),
            prefill_rows=len(specs) if prefill else 0,
            admitted=list(batch) if prefill else [],
            forward_tokens=forward_tokens,
            padded_tokens=padded_tokens,
            pool=pool,
        )
        sampled = sample_tokens(
            next_logits[live],
            [specs[row].params for row in live],
            [generators[row] for row in live],
        )
        for row, token in zip(list(live), sampled, strict=True):
            outcome.tokens[batch[row]] = token
            generated[row].append(token)
            reason = finish_reason(
                specs[row].params, len(generated[row]), token, model.config.eos_token_ids
            )
            if reason is not None:
                live.remove(row)
        if not live:
            outcome.finished = list(batch)
            yield outcome
            return
        yield outcome
        step_ids = [
            generated[row][-1] if row in live else PAD_TOKEN_ID for row in range(len(specs))
        ]
        logits = contiguous_forward(
            model, cache, torch.tensor(step_ids, device=parameter.device)[:, None]
        )
        next_logits = logits[:, -1]
        forward_tokens, padded_tokens = len(live), len(specs) - len(live)
        iteration += 1
