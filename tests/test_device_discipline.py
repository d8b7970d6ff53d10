"""What keeps the engine fast on a GPU, checked on the CPU: every tensor a step builds is put
on the model's device by name, the layers never read a tensor back to the host, and sampling
reads the batch's tokens back in one transfer.

On a GPU each read back (`.item()`, `.tolist()`, `int(t)`, a boolean mask's data-dependent
shape) waits for everything queued on the device; a factory call without `device=` builds
on the CPU and fails, or copies, when it meets the model's tensors. Both are visible on the
CPU to a `TorchFunctionMode` that records the calls.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

import llmengine
from llmengine.runner.attention import GatheredAttention
from llmengine.runner.prepare import paged_row
from llmengine.sampling import SamplingParams, make_generator, sample_tokens

FACTORIES = {
    torch.tensor, torch.as_tensor, torch.zeros, torch.ones, torch.empty, torch.full,
    torch.arange, torch.rand, torch.randn, torch.randint,
}  # fmt: skip
HOST_READS = {
    torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
    torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.nonzero,
}  # fmt: skip
MIXED_PARAMS = [
    SamplingParams(max_tokens=6),
    SamplingParams(max_tokens=6, repetition_penalty=1.3),
    SamplingParams(max_tokens=6, temperature=0.8, top_k=20, seed=1),
    SamplingParams(max_tokens=6, temperature=1.2, frequency_penalty=0.5, seed=2),
]


class DeviceCalls(TorchFunctionMode):
    """Records factory calls that name no device, and every read of a tensor by the host."""

    def __init__(self) -> None:
        super().__init__()
        self.factories_without_device: list[str] = []
        self.host_reads: list[str] = []

    def __torch_function__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func in FACTORIES and kwargs.get("device") is None:
            self.factories_without_device.append(func.__name__)
        if func in HOST_READS or _masks(func, args):
            self.host_reads.append(func.__name__)
        return func(*args, **kwargs)


def _masks(func: Any, args: tuple) -> bool:
    """Indexing by a boolean tensor: its result's shape depends on the data, read by the host."""
    if func not in (torch.Tensor.__getitem__, torch.Tensor.__setitem__):
        return False
    index = args[1]
    indices = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)


def test_every_tensor_a_step_builds_names_its_device(model: llmengine.Llama) -> None:
    engine = llmengine.Engine(model, num_blocks=16, block_size=4, num_slots=4)
    engine.add_requests([[1, 2, 3], [4, 5], [6, 7, 8, 9, 10], [11]], MIXED_PARAMS)
    with DeviceCalls() as calls:
        while engine.has_unfinished():
            engine.step()
    assert calls.factories_without_device == []


def test_no_layer_reads_a_tensor_back_to_the_host(model: llmengine.Llama) -> None:
    """The forward of a step that mixes a prefill with decodes of different lengths."""
    engine = llmengine.Engine(model, num_blocks=16, block_size=4, num_slots=3)
    engine.add_requests([[1, 2, 3, 4, 5], [6, 7]], SamplingParams(max_tokens=4))
    engine.step()
    engine.add_request([8, 9, 10], SamplingParams(max_tokens=4))
    decision = engine.scheduler.schedule()
    rows = [paged_row(row) for row in decision.rows]
    assert {len(row.token_ids) for row in rows} == {1, 3}
    attention = GatheredAttention(engine.runner.cache, rows)
    input_ids = torch.tensor([[token for row in rows for token in row.token_ids]])
    with DeviceCalls() as calls:
        model.forward_hidden(input_ids, attention.positions, attention)
    assert calls.host_reads == []


def test_sampling_reads_the_tokens_back_once() -> None:
    logits = torch.randn(len(MIXED_PARAMS), 50, generator=torch.Generator().manual_seed(0))
    generators = [make_generator(params) for params in MIXED_PARAMS]
    histories = [([1, 2, 3, 3], 2)] * len(MIXED_PARAMS)
    with DeviceCalls() as calls:
        tokens = sample_tokens(logits, MIXED_PARAMS, generators, histories)
    assert calls.host_reads == ["tolist"]
    assert calls.factories_without_device == []
    assert len(tokens) == len(MIXED_PARAMS) and all(isinstance(t, int) for t in tokens)


def test_a_step_of_plain_rows_reads_back_once(model: llmengine.Llama) -> None:
    """Greedy, seeded and penalised rows, a prefill beside decodes and decodes alone: each
    engine step reads the device once, the sampled tokens and their finite check together.
    A hidden `.item()` or `.tolist()` anywhere on the step's path fails this."""
    engine = llmengine.Engine(model, num_blocks=32, block_size=4, num_slots=4)
    engine.add_requests([[1, 2, 3, 4, 5], [6, 7]], MIXED_PARAMS[:2])
    reads = []
    for step in range(5):
        if step == 1:
            engine.add_requests([[8, 9, 10], [11]], MIXED_PARAMS[2:])
        with DeviceCalls() as calls:
            outcome = engine.step()
        assert outcome.tokens  # every step here samples
        reads.append(calls.host_reads)
    assert reads == [["tolist"]] * 5
