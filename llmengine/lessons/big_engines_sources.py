"""The documents lesson 30's facts about vLLM, SGLang, llama.cpp and TensorRT-LLM come from.

Each is a page of that engine's own documentation or source (or, for Llama 3's shape, the
model's published config), kept with its address so that every claim in
`llmengine.lessons.big_engines` can be checked where it was taken from.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Source:
    """A document a fact is taken from: whose it is, what it is called and where it lives."""

    engine: str
    title: str
    url: str


_VLLM = "https://github.com/vllm-project/vllm/blob/main/docs/"
_SGL = "https://github.com/sgl-project/sglang/blob/main/docs/advanced_features/"
_LCPP = "https://github.com/ggml-org/llama.cpp/blob/master/"
_TRT = "https://github.com/NVIDIA/TensorRT-LLM/blob/main/docs/source/features/"

SOURCES: dict[str, Source] = {
    "vllm-tuning": Source(
        "vLLM", "Optimization and Tuning", _VLLM + "configuration/optimization.md"
    ),
    "vllm-paged": Source(
        "vLLM", "PagedAttention paper (Kwon et al., SOSP 2023)", "https://arxiv.org/abs/2309.06180"
    ),
    "vllm-prefix": Source(
        "vLLM",
        "Automatic Prefix Caching (design)",
        "https://docs.vllm.ai/en/latest/design/prefix_caching/",
    ),
    "vllm-graphs": Source(
        "vLLM", "CUDA Graphs (design)", "https://docs.vllm.ai/en/latest/design/cuda_graphs/"
    ),
    "vllm-compile": Source(
        "vLLM",
        "torch.compile integration (design)",
        "https://docs.vllm.ai/en/v0.11.2/design/torch_compile/",
    ),
    "vllm-args": Source(
        "vLLM", "Engine Arguments", "https://docs.vllm.ai/en/latest/models/engine_args.html"
    ),
    "vllm-kv-fp8": Source(
        "vLLM",
        "Quantized KV Cache",
        "https://docs.vllm.ai/en/latest/features/quantization/quantized_kvcache/",
    ),
    "vllm-spec": Source(
        "vLLM", "Speculative Decoding", _VLLM + "features/speculative_decoding/README.md"
    ),
    "vllm-structured": Source(
        "vLLM", "Structured Outputs", "https://docs.vllm.ai/en/latest/features/structured_outputs/"
    ),
    "sglang-radix": Source(
        "SGLang",
        "RadixAttention and SGLang (LMSYS blog)",
        "https://lmsys.org/blog/2024-01-17-sglang/",
    ),
    "sglang-overlap": Source(
        "SGLang",
        "SGLang v0.4: zero-overhead batch scheduler (LMSYS blog)",
        "https://lmsys.org/blog/2024-12-04-sglang-v0-4/",
    ),
    "sglang-args": Source("SGLang", "Server Arguments", _SGL + "server_arguments.md"),
    "sglang-spec": Source("SGLang", "Speculative Decoding", _SGL + "speculative_decoding.md"),
    "sglang-kv-quant": Source("SGLang", "Quantized KV Cache", _SGL + "quantized_kv_cache.md"),
    "llamacpp-readme": Source("llama.cpp", "llama.cpp README", _LCPP + "README.md"),
    "llamacpp-server": Source("llama.cpp", "llama-server README", _LCPP + "tools/server/README.md"),
    "llamacpp-gguf": Source(
        "llama.cpp", "GGUF file format", "https://github.com/ggml-org/ggml/blob/master/docs/gguf.md"
    ),
    "llamacpp-blocks": Source(
        "llama.cpp", "ggml-common.h: quantized block layouts", _LCPP + "ggml/src/ggml-common.h"
    ),
    "trt-ifb": Source(
        "TensorRT-LLM",
        "Paged Attention, IFB, and Request Scheduling",
        "https://nvidia.github.io/TensorRT-LLM/features/paged-attention-ifb-scheduler.html",
    ),
    "trt-policy": Source(
        "TensorRT-LLM",
        "Useful Runtime Options: capacity scheduler policy",
        "https://nvidia.github.io/TensorRT-LLM/performance/performance-tuning-guide/useful-runtime-flags.html",
    ),
    "trt-overlap": Source(
        "TensorRT-LLM",
        "Overlap Scheduler",
        "https://nvidia.github.io/TensorRT-LLM/features/overlap-scheduler.html",
    ),
    "trt-kvcache": Source("TensorRT-LLM", "KV Cache System", _TRT + "kvcache.md"),
    "trt-attention": Source(
        "TensorRT-LLM", "Multi-Head, Multi-Query, and Group-Query Attention", _TRT + "attention.md"
    ),
    "trt-graphs": Source(
        "TensorRT-LLM",
        "Torch Compile & Piecewise CUDA Graph",
        "https://nvidia.github.io/TensorRT-LLM/features/torch_compile_and_piecewise_cuda_graph.html",
    ),
    "trt-backend": Source(
        "TensorRT-LLM",
        "Migration Guide: TensorRT Backend Removed",
        "https://nvidia.github.io/TensorRT-LLM/legacy/tensorrt-backend-removal.html",
    ),
    "trt-parallel": Source(
        "TensorRT-LLM", "Parallelism in TensorRT LLM", _TRT + "parallel-strategy.md"
    ),
    "trt-quant": Source("TensorRT-LLM", "Quantization", _TRT + "quantization.md"),
    "trt-spec": Source("TensorRT-LLM", "Speculative Decoding", _TRT + "speculative-decoding.md"),
    "llama3-config": Source(
        "Llama 3",
        "Meta-Llama-3-8B config.json",
        "https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json",
    ),
    "trt-guided": Source("TensorRT-LLM", "Guided Decoding", _TRT + "guided-decoding.md"),
}
