"""`llmengine serve` as a user runs it: a subprocess that serves, then exits 0 on SIGTERM."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path

import httpx
import pytest

from llmengine.bench.http_client import free_port
from llmengine.cli import build_parser
from llmengine.cli.options import engine_options
from llmengine.cli.serve import ENGINE_OPTIONS as SERVE_OPTIONS
from llmengine.cli.serve import NUM_BLOCKS
from llmengine.engine_config import EngineConfig

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-cli-91d2e7a35c"


def test_serve_flags_and_their_defaults() -> None:
    args = build_parser().parse_args(["serve"])
    assert (args.host, args.port, args.api_key, args.served_model_name) == (
        "127.0.0.1",
        8000,
        None,
        None,
    )
    args = build_parser().parse_args(
        ["serve", "--num-blocks", "64", "--block-size", "8", "--max-num-seqs", "4",
         "--policy", "reserve", "--preemption", "swap", "--swap-blocks", "16",
         "--max-waiting", "3", "--served-model-name", "bard", "--port", "0"]
    )  # fmt: skip
    assert (args.num_blocks, args.block_size, args.num_slots) == (64, 8, 4)
    assert (args.policy, args.preemption, args.swap_blocks) == ("reserve", "swap", 16)
    assert (args.max_waiting, args.served_model_name, args.port) == (3, "bard", 0)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--num-blocks", "0"])


def test_every_engine_knob_is_a_serve_and_bench_flag_with_the_configs_default() -> None:
    """The flags are generated from `EngineConfig`: a field added there is a flag here."""
    serve = vars(build_parser().parse_args(["serve"]))
    bench = vars(build_parser().parse_args(["bench", "--requests", "1", "--prompt-len", "1",
                                            "--max-tokens", "1"]))  # fmt: skip
    for knob in fields(EngineConfig):
        expected = NUM_BLOCKS if knob.name == "num_blocks" else knob.default
        assert serve[knob.name] == expected, knob.name
        if knob.name != "num_blocks":  # bench sweeps --pools instead
            assert bench[knob.name] is None, knob.name  # unset: bench can tell what was given
    config = EngineConfig(**engine_options(argparse.Namespace(**serve), SERVE_OPTIONS))
    assert config == EngineConfig(num_blocks=NUM_BLOCKS)


def test_serve_answers_then_exits_cleanly_on_sigterm() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LLMENGINE_API_KEY": KEY}
    command = [sys.executable, "-m", "llmengine", "serve", "--port", str(port)]
    command += ["--num-blocks", "32", "--served-model-name", "bard"]
    server = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.monotonic() + 60
        for _ in range(1200):
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert server.poll() is None, server.communicate()[0]
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.05)
        headers = {"Authorization": f"Bearer {KEY}"}
        models = httpx.get(f"{url}/v1/models", headers=headers, timeout=10).json()
        assert [card["id"] for card in models["data"]] == ["bard"]
        assert httpx.get(f"{url}/v1/models", timeout=10).status_code == 401
        body = {"model": "bard", "prompt": "ROMEO:", "max_tokens": 3}
        completion = httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=10)
        assert completion.json()["usage"]["completion_tokens"] == 3
        server.send_signal(signal.SIGTERM)
        start = time.monotonic()
        output, _ = server.communicate(timeout=10)
        assert time.monotonic() - start < 5
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)
    assert server.returncode == 0, output
    assert "Application shutdown complete" in output
    assert KEY not in output


def test_allowed_origins_are_comma_separated_and_may_repeat() -> None:
    parser = build_parser()
    args = parser.parse_args(
        ["serve", "--allowed-origins", "https://a.example, https://b.example",
         "--allowed-origins", "*"]
    )  # fmt: skip
    assert args.allowed_origins == ["https://a.example", "https://b.example", "*"]
    assert parser.parse_args(["serve"]).allowed_origins == []
    assert parser.parse_args(["serve", "--shutdown-timeout", "0"]).shutdown_timeout == 0
