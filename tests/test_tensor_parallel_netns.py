"""Two nodes on two network hosts: each `llmengine generate` runs in its own network namespace,
made by this test and joined by a veth pair, and they meet at node 0's address on that link.
The text is the single process's. Skipped where namespaces cannot be made (not root)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hf_llama import save_random_llama, save_word_level_tokenizer

from llmengine.cli import main

ROOT = Path(__file__).resolve().parent.parent
WORDS = [f"w{index}" for index in range(256)]
TIMEOUT_S = 120


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def two_hosts() -> Iterator[tuple[str, str, str]]:
    """Two namespaces joined by a veth pair: (namespace 0, namespace 1, node 0's address)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("making network namespaces needs root and iproute2")
    tag = f"{os.getpid() % 100000}"
    hosts = (f"llm0-{tag}", f"llm1-{tag}")
    links = (f"llv0-{tag}", f"llv1-{tag}")
    subnet = f"10.231.{os.getpid() % 250}"
    try:
        for host in hosts:
            ip("netns", "add", host)
            ip("-n", host, "link", "set", "lo", "up")
        ip("link", "add", links[0], "netns", hosts[0], "type", "veth", "peer", "name", links[1],
           "netns", hosts[1])  # fmt: skip
        for index, (host, link) in enumerate(zip(hosts, links, strict=True)):
            ip("-n", host, "addr", "add", f"{subnet}.{index + 1}/24", "dev", link)
            ip("-n", host, "link", "set", link, "up")
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
        for host in hosts:
            subprocess.run(["ip", "netns", "del", host], capture_output=True, check=False)
        pytest.skip(f"network namespaces unavailable here: {error}")
    try:
        yield hosts[0], hosts[1], f"{subnet}.1"
    finally:
        for host in hosts:
            subprocess.run(["ip", "netns", "del", host], capture_output=True, check=False)


def test_two_nodes_in_two_network_namespaces_print_the_single_process_text(
    two_hosts: tuple[str, str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host_0, host_1, address = two_hosts
    save_random_llama(tmp_path, vocab_size=256)
    save_word_level_tokenizer(tmp_path, WORDS)
    argv = ["generate", "--model", str(tmp_path), "--prompt", "w9 w4 w1 w7"]
    argv += ["--max-tokens", "24", "--temperature", "0", "--ignore-eos", "--kernels", "eager"]
    assert main(argv) == 0
    alone = capsys.readouterr().out
    nodes = ["--tensor-parallel-size", "2", "--nnodes", "2", "--master-addr", address]
    nodes += ["--master-port", "29517"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    runs = []
    for rank, (host, link) in enumerate(((host_0, "llv0"), (host_1, "llv1"))):
        # gloo binds to the interface named here; the namespace's only real link.
        interface = f"{link}-{host.rpartition('-')[2]}"
        command = ["ip", "netns", "exec", host, "env", f"GLOO_SOCKET_IFNAME={interface}"]
        command += [sys.executable, "-m", "llmengine", *argv, *nodes, "--node-rank", str(rank)]
        runs.append(
            subprocess.Popen(
                command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )  # fmt: skip
        )
    try:
        outputs = [run.communicate(timeout=TIMEOUT_S) for run in runs]
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.wait(10)
    assert [run.returncode for run in runs] == [0, 0], outputs
    assert outputs[0][0] == alone and outputs[1][0] == ""
