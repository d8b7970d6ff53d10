"""llmengine: an LLM inference engine built from scratch, one measured lesson at a time.

The package has layers, and this front door shows them. The serving core is `llmengine`
itself (the engine, its configuration, sampling) and its sub-packages by role: `model` (the
Llama, the checkpoint reader, the tokenizer), `speed` (what makes a loaded model fast), `kv`
(the KV storage), `scheduling` (requests and the scheduler), `structured` and `speculative`
(constraints and guesses), `runner` (the one place a forward happens) and `parallel` (tensor
parallelism); its public names are imported here.
`llmengine.bench` (workloads, batchbench, timing, throughput) and `llmengine.lessons` (figures
and walkthroughs for the notebooks) sit above it; the bench names re-exported below load on
first use, so `import llmengine` costs only the core.
"""

from importlib import import_module
from typing import Any

from llmengine.engine import Engine as Engine
from llmengine.engine_config import EngineConfig as EngineConfig
from llmengine.generation import generate_tokens as generate_tokens
from llmengine.kv.blocks import BlockPool as BlockPool
from llmengine.kv.blocks import BlockTable as BlockTable
from llmengine.kv.blocks import blocks_for_length as blocks_for_length
from llmengine.kv.contiguous_cache import ContiguousKVCache as ContiguousKVCache
from llmengine.kv.contiguous_cache import contiguous_forward as contiguous_forward
from llmengine.kv.paged_cache import PagedKVCache as PagedKVCache
from llmengine.model.config import LlamaConfig as LlamaConfig
from llmengine.model.detokenizer import IncrementalDecoder as IncrementalDecoder
from llmengine.model.llama import AttentionHook as AttentionHook
from llmengine.model.llama import Llama as Llama
from llmengine.model.loader import embedded_model_path as embedded_model_path
from llmengine.model.tokenizer import Tokenizer as Tokenizer
from llmengine.model.tokenizer import load_tokenizer as load_tokenizer
from llmengine.outcome import IterationOutcome as IterationOutcome
from llmengine.outcome import TokenLogprobs as TokenLogprobs
from llmengine.parallel.engine import TensorParallelEngine as TensorParallelEngine
from llmengine.parallel.engine import start_tensor_parallel as start_tensor_parallel
from llmengine.runner.attention import PagedRow as PagedRow
from llmengine.runner.forward import paged_forward as paged_forward
from llmengine.runner.loading import load_model as load_model
from llmengine.runner.model_runner import ModelRunner as ModelRunner
from llmengine.sampling import SamplingParams as SamplingParams
from llmengine.scheduling.request import Request as Request
from llmengine.scheduling.request import RequestState as RequestState
from llmengine.scheduling.scheduler import Scheduler as Scheduler
from llmengine.structured.constraint import Constraint as Constraint

# Names from the bench layer, by the module that defines them: resolved by `__getattr__`
# the first time they are asked for, never at `import llmengine`.
BENCH_NAMES: dict[str, str] = {
    "run_workload": "llmengine.bench.batchbench",
    "smallest_pool_running_all": "llmengine.bench.batchbench",
    "sweep_pool_sizes": "llmengine.bench.batchbench",
    "run_static_batches": "llmengine.bench.static_batch",
    "ContinuousTiming": "llmengine.bench.timing",
    "RequestSpec": "llmengine.bench.workloads",
    "mixed_workload": "llmengine.bench.workloads",
    "poisson_arrivals": "llmengine.bench.workloads",
    "staggered": "llmengine.bench.workloads",
    "uniform_burst": "llmengine.bench.workloads",
    "with_arrivals": "llmengine.bench.workloads",
    "with_budgets": "llmengine.bench.workloads",
}


def __getattr__(name: str) -> Any:
    if name not in BENCH_NAMES:
        raise AttributeError(f"module 'llmengine' has no attribute {name!r}")
    value = getattr(import_module(BENCH_NAMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(BENCH_NAMES))
