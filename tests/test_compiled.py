"""`Engine(compile=True)`: the compiled halves of every layer give transformers' logits and the
eager engine's greedy tokens, and compile a fixed handful of times, not once per step."""

from __future__ import annotations

import pytest
import torch
from hf_llama import save_random_llama
from torch._dynamo.utils import counters

import llmengine
from llmengine.cli import main
from llmengine.runner.loading import load_model
from llmengine.speed.compiled import CompiledLayers


@pytest.fixture(scope="module")
def layers():
    """One set of compiled halves for the whole file: each compile costs seconds."""
    return CompiledLayers()


def test_compiled_logits_match_transformers(tmp_path, layers):
    hf = save_random_llama(tmp_path)
    model = load_model(tmp_path)
    ids = torch.randint(
        0, hf.config.vocab_size, (1, 30), generator=torch.Generator().manual_seed(2)
    )
    positions = torch.arange(ids.shape[1])[None]
    with torch.inference_mode():
        compiled = model.compute_logits(model.forward_hidden(ids, positions, run_layer=layers))
        expected = hf(ids).logits
    assert (compiled - expected).abs().max().item() < 1e-4


def test_compiled_engine_generates_the_eager_tokens(model, layers):
    prompts = [[1, 5, 9, 13, 2, 7][: 2 + index] for index in range(5)]
    params = llmengine.SamplingParams(max_tokens=12, ignore_eos=True)
    eager = llmengine.Engine(model, num_blocks=24, num_slots=3).generate(prompts, params)
    engine = llmengine.Engine(model, num_blocks=24, num_slots=3)
    engine.runner.compiled_layers = layers
    assert engine.generate(prompts, params) == eager


def test_warm_up_compiles_every_size_once(model, layers):
    layers.warm_up(model)
    graphs = counters["stats"]["unique_graphs"]
    engine = llmengine.Engine(model, num_blocks=40, num_slots=8)
    engine.runner.compiled_layers = layers
    prompts = [[3] * length for length in (1, 4, 9, 17, 30)]
    engine.generate(prompts, llmengine.SamplingParams(max_tokens=20, ignore_eos=True))
    assert counters["stats"]["unique_graphs"] == graphs


def test_engine_compile_flag_compiles_at_construction(model):
    engine = llmengine.Engine(model, num_blocks=8, compile=True)
    assert engine.runner.compiled_layers is not None
    assert engine.runner.compile_seconds > 0
    assert llmengine.Engine(model, num_blocks=8).runner.compiled_layers is None


def test_serve_takes_compile_to_the_engine(monkeypatch, capsys):
    def refuse(*args, compile: bool, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise ValueError(f"the engine got compile={compile}")

    # The flag reaches the engine before any server runs: one that refuses ends the command.
    # Built in this process (--no-engine-process), where the refusing engine is patched in.
    monkeypatch.setattr(llmengine, "Engine", refuse)
    for argv, value in ((["--compile"], True), ([], False)):
        assert main(["serve", "--no-engine-process", *argv]) == 2
        assert f"compile={value}" in capsys.readouterr().err
