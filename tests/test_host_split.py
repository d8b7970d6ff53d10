"""The stage clock of one stream's decode step (`llmengine.bench.host_split`): every stage is
timed once per step on the engine's own objects, and the tokens are the ones an engine
without the clock gives."""

from __future__ import annotations

import llmengine
from llmengine.bench.host_split import HOST_STAGES, STAGES, StageClock, stream_split
from llmengine.engine import Engine
from llmengine.params import SamplingParams

PROMPT = list(range(1, 17))


def test_stream_split_times_every_stage_of_every_decode_step(model: llmengine.Llama) -> None:
    engine = Engine(model, num_blocks=16, block_size=4, num_slots=1)
    clock = StageClock(engine)
    split = stream_split(engine, clock, PROMPT, 9)
    assert all(len(clock.seconds[name]) == 8 for name, _, _ in STAGES)  # 8 decode steps
    assert split["step"] >= split["forward"] > 0 and split["tokens_per_s"] > 0
    # Each step holds its stages one after another, so step by step the rest is never
    # negative and the host's share holds each stage but the forward: so do the medians.
    assert split["rest"] >= 0
    assert all(split["host"] >= split[name] for name in HOST_STAGES)
    plain = Engine(model, num_blocks=16, block_size=4, num_slots=1)
    params = SamplingParams(max_tokens=9, ignore_eos=True)
    clocked = engine.generate([PROMPT], params)
    assert clocked == plain.generate([PROMPT], params)
    # The clock wrapped one engine's objects, never their classes.
    assert plain.runner.execute.__func__ is type(plain.runner).execute
    assert not hasattr(engine.runner.execute, "__func__")
