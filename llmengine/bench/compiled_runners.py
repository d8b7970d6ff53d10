"""The compiled contenders: transformers' `generate` compiled over a static cache, and
llmengine's `Engine(..., compile=True)`, next to the three eager engines of `throughput`.

`generate_compiled` is transformers' best setting for a CPU: a static cache (fixed shapes from
the first step to the last) with the model's forward through torch.compile, which `generate`
does itself when given a `CompileConfig`. On a GPU that happens automatically with a static
cache; on a CPU `generate` compiles only when the configuration asks for all devices
(`GenerationMixin._valid_auto_compile_criteria`). Compilation happens on the first call for
each batch shape, so whoever times it must warm it up on the shapes it times
(`throughput.compare(..., warmup=None)`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from llmengine.bench import throughput
from llmengine.bench.throughput import EngineRun, Runner
from llmengine.bench.workloads import RequestSpec
from llmengine.model.llama import Llama

if TYPE_CHECKING:
    import transformers

ALL_ENGINES = ("llmengine", "llmengine compiled", "generate", "generate_compiled", "generate_batch")
COMPILED_ENGINES = ("llmengine compiled", "generate_compiled")
LLMENGINE_ENGINES = ("llmengine", "llmengine compiled")


def cpu_compile_config() -> transformers.CompileConfig:
    """The `CompileConfig` under which `generate` compiles its forward on a CPU too.

    Mode "default": transformers' "reduce-overhead" means CUDA graphs, which a CPU has none of.
    """
    import transformers

    config = transformers.CompileConfig(mode="default")
    # transformers' own switch for compiling off the GPU (read in _valid_auto_compile_criteria).
    config._compile_all_devices = True
    return config


def run_generate_compiled(
    hf_model: transformers.LlamaForCausalLM, workload: Sequence[RequestSpec]
) -> EngineRun:
    """`throughput.run_generate` with a static cache and the forward through torch.compile."""
    return throughput.run_generate(
        hf_model,
        workload,
        engine="generate_compiled",
        cache_implementation="static",
        compile_config=cpu_compile_config(),
    )


def all_runners(
    model: Llama, hf_model: transformers.LlamaForCausalLM, block_size: int = 16
) -> dict[str, Runner]:
    """The five engines on one pair of identical models, in ALL_ENGINES order."""
    eager = throughput.standard_runners(model, hf_model, block_size)
    return {
        "llmengine": eager["llmengine"],
        "llmengine compiled": lambda workload: throughput.run_llmengine(
            model, workload, block_size, compile=True
        ),
        "generate": eager["generate"],
        "generate_compiled": lambda workload: run_generate_compiled(hf_model, workload),
        "generate_batch": eager["generate_batch"],
    }
