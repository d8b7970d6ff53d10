"""What vLLM, SGLang, llama.cpp and TensorRT-LLM do, feature by feature, beside llmengine.

Every cell about a peer is a short sentence of ours with the keys of the documents it rests
on (`SOURCES`: each a page of that engine's own documentation or source, with its address),
so a reader can check each fact where it was taken from. Every cell about llmengine names
the lessons that measure it by file name without the number (`lessons/NN-<slug>.ipynb`): the
number shown is read from the file, and a cited lesson that is missing is an error rather
than a dead reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llmengine.lessons.big_engines_sources import SOURCES

ENGINES = ("vLLM", "SGLang", "llama.cpp", "TensorRT-LLM")


@dataclass(frozen=True, slots=True)
class Claim:
    """What one engine does for one feature, in our words, and the sources that say so."""

    text: str
    sources: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Feature:
    """One row of the comparison: llmengine's way, the lessons measuring it, and each peer's
    claim in the order of `ENGINES`."""

    name: str
    ours: str
    lessons: tuple[str, ...]
    peers: tuple[Claim, Claim, Claim, Claim]


FEATURES: tuple[Feature, ...] = (
    Feature(
        "scheduling",
        "continuous batching; blocks bought a step at a time; the youngest running request "
        "preempted by recompute or swap; a watermark of free blocks",
        ("continuous-batching", "blocks-a-step-at-a-time", "why-the-youngest",
         "the-watermark-measured", "swap-against-recompute"),
        (Claim("continuous batching; a preempted request is recomputed (the default mode, "
               "not swap)", ("vllm-tuning",)),
         Claim("continuous batching; the next batch is scheduled on the CPU while the GPU "
               "runs the current one (overlap scheduler, on by default)",
               ("sglang-overlap", "sglang-args")),
         Claim("a fixed number of slots (`--parallel`); continuous batching on by default",
               ("llamacpp-server",)),
         Claim("in-flight batching; the default policy admits a request only if it never "
               "has to pause it; overlap scheduler on by default",
               ("trt-ifb", "trt-policy", "trt-overlap"))),
    ),
    Feature(
        "KV layout",
        "paged: blocks of `block_size` tokens (16 by default) found through block tables",
        ("the-paged-cache", "fragmentation"),
        (Claim("paged (PagedAttention): fixed-size blocks mapped through block tables",
               ("vllm-paged",)),
         Claim("K/V allocated in pages of `--page-size` tokens, 1 by default",
               ("sglang-args",)),
         Claim("one context of `-c` tokens; `--kv-unified` makes it a single buffer "
               "shared by every sequence", ("llamacpp-server",)),
         Claim("paged: blocks of a power-of-two number of tokens, several layers packed in "
               "one block", ("trt-kvcache",))),
    ),
    Feature(
        "prefix reuse",
        "full blocks keyed by their tokens chained to the previous block's key; a request "
        "takes its leading full blocks, never the one holding its last token",
        ("prefix-caching",),
        (Claim("automatic prefix caching: a full block is hashed with its tokens and the "
               "tokens before it", ("vllm-prefix",)),
         Claim("RadixAttention: a radix tree over token sequences; with pages of 1 token a "
               "match can end at any token", ("sglang-radix", "sglang-args")),
         Claim("prompt caching on by default (`--cache-prompt`), with a RAM cache of idle "
               "slots' prompts (`--cache-ram`); `--cache-reuse` moves matching chunks by "
               "shifting their KV",
               ("llamacpp-server",)),
         Claim("blocks enter a radix search tree once they are full and are shared by later "
               "requests with that prefix", ("trt-kvcache",))),
    ),
    Feature(
        "chunked prefill",
        "`max_num_batched_tokens` per step: decode rows first, then prompt chunks",
        ("chunked-prefill",),
        (Claim("always on: decodes first, then prefills chunked to fit "
               "`max_num_batched_tokens`", ("vllm-tuning",)),
         Claim("`--chunked-prefill-size` tokens per chunk", ("sglang-args",)),
         Claim("a prompt goes through in physical batches of `--ubatch-size` tokens",
               ("llamacpp-server",)),
         Claim("chunked context: every chunk but the last a multiple of the KV block size",
               ("trt-attention",))),
    ),
    Feature(
        "kernels",
        "on the CPU, each matrix product's kernel chosen per weight shape and row count by "
        "timing the candidates at start-up; attention gathers K/V through the block tables",
        ("the-step-costs-operators", "kernels-and-precision"),
        (Claim("GPU attention backends of several libraries, FlashAttention among them",
               ("vllm-graphs",)),
         Claim("`--attention-backend`: FlashInfer, FlashAttention 3, Triton and others",
               ("sglang-args",)),
         Claim("ggml's own kernels: AVX, AVX2, AVX512 and AMX on x86, NEON on ARM, custom "
               "CUDA kernels", ("llamacpp-readme",)),
         Claim("its own attention op by default: one fused kernel for a context, masked MHA "
               "or XQA kernels for generation", ("trt-attention",))),
    ),
    Feature(
        "graphs",
        "the decode step compiled whole per batch bucket (inductor on the CPU, one CUDA "
        "graph per bucket on a GPU); prefills stay eager",
        ("the-compiled-step-and-the-peers",),
        (Claim("torch.compile by default; CUDA graphs piecewise (attention left out) or "
               "full, chosen per batch", ("vllm-compile", "vllm-graphs")),
         Claim("CUDA graphs, and piecewise CUDA graphs for prefill, both on by default",
               ("sglang-args",)),
         Claim("not covered by the sources cited here", ()),
         Claim("PyTorch is its only execution backend, with no engine-build step; "
               "torch.compile and piecewise CUDA graphs for context steps",
               ("trt-backend", "trt-graphs"))),
    ),
    Feature(
        "parallelism",
        "tensor parallelism (Megatron's split) over processes joined by gloo, on one "
        "machine or several",
        ("past-one-process",),
        (Claim("tensor, pipeline, expert and data parallelism", ("vllm-tuning",)),
         Claim("`--tp`, `--pp`, `--dp` and `--ep`", ("sglang-args",)),
         Claim("`--split-mode layer` (default: layers and KV split across GPUs, pipelined) "
               "or `row`", ("llamacpp-server",)),
         Claim("tensor, pipeline, data, expert and context parallelism",
               ("trt-parallel",))),
    ),
    Feature(
        "quantization",
        "weights in bfloat16, or int8 with one scale per output channel; K/V in the model's "
        "dtype",
        ("kernels-and-precision",),
        (Claim("FP8, AWQ, GPTQ and other weight formats; an FP8 KV cache",
               ("vllm-args", "vllm-kv-fp8")),
         Claim("`--quantization` fp8, awq, gptq and others; `--kv-cache-dtype` "
               "fp8_e4m3 or fp8_e5m2", ("sglang-args",)),
         Claim("GGUF files with 1.5- to 8-bit integer weights; K/V as q8_0, q4_0 and other "
               "types (`--cache-type-k`, `--cache-type-v`)",
               ("llamacpp-gguf", "llamacpp-readme", "llamacpp-server")),
         Claim("FP4, FP8, AWQ and GPTQ recipes; an FP8 KV cache", ("trt-quant",))),
    ),
    Feature(
        "speculation",
        "prompt lookup (n-gram), or a draft model that shares the target's block tables",
        ("guess-then-check",),
        (Claim("n-gram prompt lookup, suffix decoding, a draft model, EAGLE, MTP and more",
               ("vllm-spec",)),
         Claim("EAGLE-2 and EAGLE-3, MTP, a standalone draft model, n-gram",
               ("sglang-spec", "sglang-args")),
         Claim("speculative decoding in the server; lookup decoding from a lookup cache "
               "(`--lookup-cache-static`)",
               ("llamacpp-server",)),
         Claim("draft/target, EAGLE 3, n-gram prompt lookup, MTP and more",
               ("trt-spec",))),
    ),
    Feature(
        "structured output",
        "llguidance: a grammar compiled once, a token mask every step",
        ("a-grammar-as-a-mask",),
        (Claim("xgrammar or guidance backends", ("vllm-structured",)),
         Claim("`--grammar-backend` xgrammar, outlines or llguidance", ("sglang-args",)),
         Claim("GBNF grammars and JSON schemas (`--grammar`, `--json-schema`)",
               ("llamacpp-server",)),
         Claim("XGrammar or LLGuidance", ("trt-guided",))),
    ),
)  # fmt: skip


def lesson_number(slug: str, lessons: Path) -> str:
    """The two-digit number of the one lesson `lessons/NN-<slug>.ipynb`."""
    found = sorted(lessons.glob(f"[0-9][0-9]-{slug}.ipynb"))
    if len(found) != 1:
        raise FileNotFoundError(f"{len(found)} lessons named {slug!r} in {lessons}")
    return found[0].name[:2]


# Cited beside the table, by the lesson's section on what a token of context costs.
CITED_ELSEWHERE = ("llama3-config", "llamacpp-blocks", "sglang-kv-quant")


def citation_order() -> list[str]:
    """Source keys in the order they are first cited (the table, then `CITED_ELSEWHERE`):
    a key's reference number is its index + 1."""
    order: list[str] = []
    cited = [key for feature in FEATURES for claim in feature.peers for key in claim.sources]
    for key in [*cited, *CITED_ELSEWHERE]:
        if key not in order:
            order.append(key)
    return order


def reference_number(key: str) -> int:
    """The number a source has in `references()`."""
    return citation_order().index(key) + 1


def feature_rows(lessons: Path) -> list[tuple[str, ...]]:
    """The comparison as table rows: the feature, ours with the lessons measuring it, then
    each peer's claim followed by the numbers of its references."""
    rows = []
    for feature in FEATURES:
        numbers = [lesson_number(slug, lessons) for slug in feature.lessons]
        cited = ("lessons " if len(numbers) > 1 else "lesson ") + ", ".join(numbers)
        peers = [
            f"{claim.text} [{', '.join(str(reference_number(key)) for key in claim.sources)}]"
            if claim.sources
            else claim.text
            for claim in feature.peers
        ]
        rows.append((feature.name, f"{feature.ours} ({cited})", *peers))
    return rows


def references() -> str:
    """The numbered list of every cited source, as Markdown."""
    return "".join(
        f"{number}. {SOURCES[key].engine}: [{SOURCES[key].title}]({SOURCES[key].url})\n"
        for number, key in enumerate(citation_order(), start=1)
    )
