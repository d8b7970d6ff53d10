"""One burst timed as a GPU user times it: TTFT, decode and whole-run tokens/s from one clock.

The clock is the same for every run (`TIMER`): the device is synchronised and
`time.perf_counter()` read before the run and after each engine step. An llmengine run is then
three timestamps: start, first token (the end of the step in which the last request got its
first token, i.e. the prefill) and end. TTFT, the decode rate and the whole-run rate all come
from those three, so a run's decode time plus its TTFT is its whole time by construction and
no two columns can disagree. transformers' `generate` is one call, so only its whole run is
timed, around the call, by the same clock.

Every timed run is a second call: each engine (and transformers, whose first call compiles its
forward) first serves a burst of the same shape with other prompts, untimed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from llmengine.bench import throughput
from llmengine.bench.workloads import RequestSpec
from llmengine.engine import Engine
from llmengine.model.llama import Llama

if TYPE_CHECKING:
    import transformers

TIMER = (
    "`torch.cuda.synchronize()` then `time.perf_counter()`, before a run and after every "
    "engine step (around the whole call for transformers)"
)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so the host clock reads when it is done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True, slots=True)
class BurstRun:
    """One timed run of a burst: its timestamps and what it produced.

    `first_token` is None for a run timed as one call (transformers). `decode_bytes` is what
    the decode steps must read at least, summed: every weight once per step, plus the K/V each
    row attends over.
    """

    engine: str
    batch: int
    start: float
    first_token: float | None
    end: float
    tokens: int
    decode_steps: int
    decode_bytes: float
    outputs: list[list[int]]

    @property
    def whole_s(self) -> float:
        return self.end - self.start

    @property
    def whole_tokens_per_s(self) -> float:
        return self.tokens / self.whole_s

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start

    @property
    def decode_s(self) -> float | None:
        return None if self.first_token is None else self.end - self.first_token

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens after each request's first, over the time after the prefill."""
        decode_s = self.decode_s
        return None if not decode_s else (self.tokens - self.batch) / decode_s

    @property
    def step_s(self) -> float | None:
        decode_s = self.decode_s
        return None if not decode_s else decode_s / self.decode_steps

    @property
    def bandwidth_gbs(self) -> float | None:
        decode_s = self.decode_s
        return None if not decode_s else self.decode_bytes / decode_s / 1e9


def weight_bytes(model: Llama) -> int:
    """Bytes of the weights a decode step reads once each (`throughput.decode_weights`)."""
    return sum(w.numel() * w.element_size() for w in throughput.decode_weights(model))


def engine_for(
    model: Llama, workload: Sequence[RequestSpec], block_size: int, **options: Any
) -> Engine:
    """An engine with a slot for every request and a pool for all of them at once."""
    return Engine(
        model,
        num_blocks=throughput.pool_blocks(workload, block_size),
        block_size=block_size,
        num_slots=len(workload),
        **options,
    )


def engine_burst(
    engine: Engine,
    workload: Sequence[RequestSpec],
    warmup: Sequence[RequestSpec],
    name: str,
) -> BurstRun:
    """`warmup` through `engine` untimed, then `workload` timed step by step."""
    model = engine.runner.model
    device = next(model.parameters()).device
    engine.generate(throughput.prompts_of(warmup), [spec.params for spec in warmup])
    per_step = weight_bytes(model)
    kv_per_token = engine.runner.cache.bytes_per_block / engine.config.block_size
    synchronize(device)
    start = now = time.perf_counter()
    ids = engine.add_requests(throughput.prompts_of(workload), [spec.params for spec in workload])
    first_token: float | None = None
    decode_steps, decode_bytes = 0, 0.0
    while engine.has_unfinished():
        outcome = engine.step()
        synchronize(device)
        now = time.perf_counter()
        if first_token is not None:
            decode_steps += 1
            decode_bytes += per_step + kv_per_token * outcome.kv_tokens
        elif all(engine.request(request_id).output_token_ids for request_id in ids):
            first_token = now
    outputs = [engine.release(request_id).output_token_ids for request_id in ids]
    tokens = throughput.useful_tokens(outputs, workload)
    return BurstRun(
        name, len(workload), start, first_token, now, tokens, decode_steps, decode_bytes, outputs
    )


def generate_burst(
    hf_model: transformers.LlamaForCausalLM,
    workload: Sequence[RequestSpec],
    warmup: Sequence[RequestSpec],
    name: str,
    **generate_options: Any,
) -> BurstRun:
    """transformers `generate` on `warmup` (it compiles there), then on `workload`, timed."""
    device = hf_model.device
    throughput.run_generate(hf_model, warmup, **generate_options)
    synchronize(device)
    start = time.perf_counter()
    run = throughput.run_generate(hf_model, workload, **generate_options)
    synchronize(device)
    end = time.perf_counter()
    return BurstRun(name, len(workload), start, None, end, run.useful_tokens, 0, 0.0, run.outputs)


def generate_compiles(hf_model: transformers.LlamaForCausalLM) -> bool:
    """Whether `generate` compiled the model's forward (transformers keeps the compiled call)."""
    return hasattr(hf_model, "_compiled_call")
