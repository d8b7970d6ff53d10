"""The paged decode attention kernel (Triton) of the CUDA decode graphs, checked without a GPU:
its numbers and the engine's tokens in Triton's interpreter (a process of its own,
`tests/paged_decode_interpreted.py`), its compilation for the H100/H200's architecture
(sm_90) down to a cubin, the choice of attention, and the fall-back to gathering when the
kernel raises. `tests/test_cuda.py` runs it on a GPU.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from paged_decode_interpreted import PagedEngine
from test_decode_graph import POOL, TINY, run, workload

import llmengine.runner.cuda_graphs as cuda_graphs
from llmengine.bench.decode_step import random_llama
from llmengine.engine import Engine
from llmengine.kv.paged_cache import PagedKVCache
from llmengine.runner import paged_decode
from llmengine.runner.cuda_graphs import default_attention

ROOT = Path(__file__).resolve().parent.parent
needs_triton = pytest.mark.skipif(not paged_decode.available(), reason="Triton not installed")


@needs_triton
def test_in_tritons_interpreter_it_equals_gathered_attention_and_keeps_the_tokens() -> None:
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}",
    }
    script = ROOT / "tests" / "paged_decode_interpreted.py"
    checked = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "every check passed" in checked.stdout


@needs_triton
@pytest.mark.parametrize(
    ("pointer", "group", "head_dim", "block_size"),
    [("*bf16", 4, 64, 16), ("*fp32", 2, 32, 16), ("*fp16", 3, 80, 32)],
)
def test_it_compiles_for_sm_90_down_to_a_cubin(
    pointer: str, group: int, head_dim: int, block_size: int, tmp_path: Path, monkeypatch
) -> None:
    """The 1B shape in bfloat16 (4 query heads a K/V head, head dim 64), the embedded model's
    in float32 and a group and head dim that are not powers of two: what a GPU would compile
    at its first launch, compiled here for the H100/H200's architecture (no GPU needed), in
    a cache of the test's own, so nothing is taken from an earlier compile."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    pointers = ("q_ptr", "k_ptr", "v_ptr", "out_ptr")
    strides = ("q_row", "q_head", "kv_slot", "kv_head", "out_row", "out_head")
    signature = {name: pointer for name in pointers} | {"tables_ptr": "*i64", "lengths_ptr": "*i64"}
    signature |= {name: "i32" for name in (*strides, "table_row", "table_column")}
    signature["scale"] = "fp32"
    constants = {"GROUP": group, "GROUP_PAD": triton.next_power_of_2(group)}
    constants |= {"HEAD_DIM": head_dim, "DIM_PAD": triton.next_power_of_2(head_dim)}
    constants["BLOCK_SIZE"] = block_size
    signature |= dict.fromkeys(constants, "constexpr")
    source = ASTSource(fn=paged_decode._paged_decode, signature=signature, constexprs=constants)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32))
    assert len(compiled.asm["cubin"]) > 0
    assert ".entry _paged_decode_kernel" in compiled.asm["ptx"]


@needs_triton
def test_cpu_tensors_outside_the_interpreter_are_refused() -> None:
    if paged_decode.interpreted():
        pytest.skip("this process runs Triton's interpreter")
    q = torch.zeros(1, 1, 2, 4)
    cache = torch.zeros(8, 1, 4)
    tables, lengths = torch.zeros(1, 2, dtype=torch.long), torch.ones(1, dtype=torch.long)
    with pytest.raises(ValueError, match="interpreter"):
        paged_decode.paged_decode_attention(q, cache, cache, tables, lengths, 4)


def test_cuda_takes_the_paged_kernel_where_triton_is_installed(monkeypatch) -> None:
    monkeypatch.setattr(paged_decode, "available", lambda: True)
    assert default_attention(torch.device("cuda")) == "paged"
    assert default_attention(torch.device("cpu")) == "gathered"
    monkeypatch.setattr(paged_decode, "available", lambda: False)
    assert default_attention(torch.device("cuda")) == "gathered"


def test_an_unknown_attention_is_refused() -> None:
    tiny = random_llama(TINY, seed=3, std=0.2)
    cache = PagedKVCache(TINY, 5, 4, dtype=torch.float32, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="attention must be one of"):
        cuda_graphs.StaticDecodeGraphs(tiny, cache, 4, [1], capture=False, attention="flash")


def test_a_paged_kernel_that_raises_is_given_up_for_gathering(monkeypatch, caplog) -> None:
    """The kernel raises at the first bucket's warm-up (as a compile error would on a GPU):
    that bucket and every later one are built gathering, start-up says why, and the tokens
    are the eager engine's."""
    calls = []

    def broken(*args, **kwargs):
        calls.append(args)
        raise RuntimeError("no kernel here")

    monkeypatch.setattr(paged_decode, "paged_decode_attention", broken)
    tiny = random_llama(TINY, seed=3, std=0.2)
    with caplog.at_level(logging.INFO, logger="llmengine.runner"):
        engine = PagedEngine(tiny, decode_graph=(2, 4), **POOL)
    graphs = engine.runner.graphs
    assert len(calls) == 1  # bucket 4's first layer, then never again
    assert graphs.attention == {2: "gathered", 4: "gathered"} and graphs.buckets == [2, 4]
    assert graphs.paged_failure == "RuntimeError: no kernel here" and graphs.failures == {}
    assert "paged attention given up: RuntimeError: no kernel here" in caplog.text
    prompts, params = workload(seed=0, count=5)
    tokens, used, _ = run(engine, prompts, params)
    assert sum(used) > 0
    assert tokens == run(Engine(tiny, **POOL), prompts, params)[0]
