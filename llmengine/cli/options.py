"""The command line's shared options: number types, the model and device flags, and the
engine's flags, generated from `EngineConfig` so that a new engine knob needs no edit here."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmengine.engine_config import default_of, option_of
from llmengine.model.config import DTYPES
from llmengine.speed.projections import PREPARATIONS
from llmengine.speed.quantization import QUANTIZATIONS

if TYPE_CHECKING:
    from llmengine.engine import Engine
    from llmengine.model.llama import Llama
    from llmengine.parallel.cluster import Cluster

Group = argparse.ArgumentParser | argparse._ArgumentGroup  # argparse names no public type


def _number_type(
    convert: Callable[[str], float], expected: str, valid: Callable[[float], bool], rule: str
) -> Callable[[str], float]:
    """An argparse type: `convert` the text, then refuse a value that is not `valid`."""

    def parse(text: str) -> float:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not valid(value):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
        return value

    return parse


positive_int = _number_type(int, "a whole number", lambda value: value >= 1, "at least 1")
non_negative_int = _number_type(int, "a whole number", lambda value: value >= 0, "at least 0")
# Requests per second: a positive number, or `inf` for all at once.
request_rate = _number_type(float, "requests per second", lambda value: value > 0, "positive")
positive_float = _number_type(
    float, "a number", lambda value: 0 < value < math.inf, "a positive number"
)
non_negative_float = _number_type(
    float, "a number", lambda value: 0 <= value < math.inf, "a number >= 0"
)
WHOLE_NUMBER_TYPES = {0: non_negative_int, 1: positive_int}


def add_model_argument(parser: Group) -> None:
    """`--model DIR`, the checkpoint every subcommand that runs a model accepts."""
    parser.add_argument(
        "--model", type=Path, default=None, metavar="DIR",
        help="checkpoint folder (Hugging Face Llama layout); default: the embedded model",
    )  # fmt: skip


def add_device_arguments(parser: Group) -> None:
    """`--device`, `--dtype`, `--kernels` and `--quantization`: where the model and its KV cache
    live, in what precision, and how its matrix products are computed.

    All default to None (the CPU, float32, kernels measured, no quantization), so a mode that
    has no model can refuse them. A device this machine lacks is refused by `load_model`, as
    a one-line error.
    """
    parser.add_argument(
        "--device", default=None, metavar="DEVICE",
        help="where the weights and the KV cache live: cpu (default), cuda or cuda:N",
    )  # fmt: skip
    parser.add_argument(
        "--dtype", choices=(*DTYPES, "auto"), default=None,
        help="weights and KV cache precision (default float32; auto: the checkpoint's own)",
    )  # fmt: skip
    parser.add_argument(
        "--kernels", choices=PREPARATIONS, default=None,
        help="matrix-product kernels: measured at load on this machine (default), "
        "packed (MKL's packed copy for 4-48 rows) or eager (F.linear)",
    )  # fmt: skip
    parser.add_argument(
        "--quantization", choices=("none", *QUANTIZATIONS), default=None,
        help="int8: store the weights as int8, one scale per output channel (CPU only); "
        "none (default): in --dtype",
    )  # fmt: skip


def load_model(args: argparse.Namespace, path: Path | None) -> Llama:
    """The checkpoint at `path` on the `--device` and in the `--dtype` the command was given."""
    import llmengine

    return llmengine.load_model(
        path,
        device=args.device or "cpu",
        dtype=args.dtype,
        kernels=args.kernels or "measured",
        quantization=None if args.quantization == "none" else args.quantization,
    )


def add_engine_arguments(
    parser: Group,
    names: Sequence[str],
    *,
    defaults: Mapping[str, Any] | None = None,
    flags: Mapping[str, str] | None = None,
    unset: bool = False,
) -> None:
    """One flag per named `EngineConfig` field, its spelling, help and checks from the field.

    `defaults` overrides a field's default for this command; `flags` picks which of a field's
    spellings this command uses (the default: all of them); with `unset`, every flag left
    out is None (a flag False), so the command can tell which were given.
    """
    for name in names:
        option = option_of(name)
        default = (defaults or {}).get(name, default_of(name))
        spellings = (flags[name],) if flags and name in flags else option.flags
        shown = "" if default is None or isinstance(default, bool) else f" (default {default})"
        settings: dict[str, Any] = {"dest": name, "help": option.help + shown}
        if isinstance(default_of(name), bool):
            settings.update(action="store_true", default=None if unset else default)
        elif option.choices:
            settings.update(choices=option.choices, default=None if unset else default)
        else:
            # A field with a minimum is a whole number; one without is text (a name or path).
            kind = str if option.minimum is None else WHOLE_NUMBER_TYPES[option.minimum]
            settings.update(type=kind, metavar=option.metavar, default=None if unset else default)
        parser.add_argument(*spellings, **settings)


def engine_options(args: argparse.Namespace, names: Sequence[str]) -> dict[str, Any]:
    """The named engine fields the command line gave (those left None keep their default)."""
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def add_parallel_argument(parser: Group, *, unset: bool = False) -> None:
    """`--tensor-parallel-size N` (split every layer across N processes, `llmengine.parallel`)
    and where those processes live: `--nnodes`, `--node-rank`, `--master-addr`,
    `--master-port` (left out: torchrun's environment variables, else one node on 127.0.0.1).
    With `unset`, a left-out size is None, so the command can tell whether it was given."""
    parser.add_argument(
        "--tensor-parallel-size", type=positive_int, default=None if unset else 1, metavar="N",
        help="split every layer across N processes (torch.distributed, gloo); default 1",
    )  # fmt: skip
    parser.add_argument(
        "--nnodes", type=positive_int, default=None, metavar="M",
        help="machines the N processes spread over, N/M on each (default 1)",
    )  # fmt: skip
    parser.add_argument(
        "--node-rank", type=non_negative_int, default=None, metavar="R",
        help="this machine's place among them; node 0 runs the scheduler (default 0)",
    )  # fmt: skip
    parser.add_argument(
        "--master-addr", default=None, metavar="HOST",
        help="node 0's address, where the ranks meet (default 127.0.0.1)",
    )  # fmt: skip
    parser.add_argument(
        "--master-port", type=positive_int, default=None, metavar="PORT",
        help="the port node 0 listens on for them (default: a free one, one node only)",
    )  # fmt: skip


NODE_OPTIONS = ("nnodes", "node_rank", "master_addr", "master_port")


def is_worker_node(args: argparse.Namespace) -> bool:
    """Whether this machine only runs ranks for node 0 (no engine of its own here)."""
    if (args.tensor_parallel_size or 1) == 1:
        given = [name for name in NODE_OPTIONS if getattr(args, name) is not None]
        if given:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            raise ValueError(f"{flags} need --tensor-parallel-size above 1")
        return False
    return cluster_of(args).node_rank > 0


def cluster_of(args: argparse.Namespace) -> Cluster:
    """The cluster the command line (or torchrun's environment) describes."""
    from llmengine.parallel.cluster import Cluster

    return Cluster.of(
        args.tensor_parallel_size,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        master_addr=args.master_addr,
        master_port=args.master_port,
    )


def build_engine(args: argparse.Namespace, model: Llama | None, **options: Any) -> Engine:
    """An engine on `model` in this process, or (with no model) rank 0 of
    `--tensor-parallel-size` processes, on the CPU: the ranks talk over gloo."""
    import llmengine

    if model is not None:
        return llmengine.Engine(model, **options)
    return llmengine.start_tensor_parallel(
        args.model, tensor_parallel_size=cluster_of(args), **parallel_load(args), **options
    )


def run_worker_node(args: argparse.Namespace, **options: Any) -> int:
    """This machine's ranks, when it is not node 0: they follow node 0 until it stops."""
    from llmengine.parallel.engine import run_worker_node

    return run_worker_node(args.model, cluster_of(args), **parallel_load(args), **options)


def parallel_load(args: argparse.Namespace) -> dict[str, Any]:
    """How every rank loads its slice: the CPU only, the ranks talking over gloo."""
    if (args.device or "cpu") != "cpu":
        raise ValueError("--tensor-parallel-size runs its ranks on the CPU (gloo); leave --device")
    return {
        "dtype": args.dtype,
        "kernels": args.kernels or "measured",
        "quantization": None if args.quantization in (None, "none") else args.quantization,
    }
