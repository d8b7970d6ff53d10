"""Read a Hugging Face Llama checkpoint (safetensors, single file or sharded) into `Llama`.

The model is built on the meta device (shapes, no memory, no initialisation), every tensor
name and shape in the checkpoint is checked against it, and only then are the tensors read
and assigned. A broken checkpoint therefore raises before anything is half-loaded.

What comes out is the plain model of `llmengine.model.llama`; making it fast is the model
runner's business (`llmengine.runner.loading.load_model` prepares it after reading).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch.overrides import TorchFunctionMode

from llmengine.model.config import DTYPES, LlamaConfig
from llmengine.model.llama import Llama
from llmengine.model.sharding import Shard, local_config, read_shard

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # recomputed from the config, never loaded


def embedded_model_path() -> Path:
    """The folder of the small model shipped inside the package (`path=None` loads it)."""
    return Path(__file__).parent.parent / "data" / "tiny-shakespeare"


def model_folder(path: str | Path | None) -> Path:
    """The checkpoint folder for `path` (the embedded model when None); it must exist."""
    folder = embedded_model_path() if path is None else Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"model folder does not exist: {folder}")
    return folder


def load_checkpoint(
    path: str | Path | None = None,
    *,
    dtype: torch.dtype | str | None = None,
    device: str | torch.device = "cpu",
    shard: Shard | None = None,
) -> Llama:
    """Read a Llama checkpoint folder into a plain `Llama`, in eval mode with gradients off.

    `dtype`: None means float32, "auto" the checkpoint's own dtype, else a torch dtype
    or its name ("float32", "bfloat16", "float16"). `device` is where the weights go
    ("cpu", "cuda", "cuda:1", ...); one this machine does not have raises ValueError before
    anything is read.

    `shard` reads one rank's slice for tensor parallelism (`llmengine.model.sharding`):
    every tensor is checked against the whole model, and only this rank's part is read.
    """
    target_device = resolve_device(device)
    folder = model_folder(path)
    config = LlamaConfig.from_file(folder / "config.json")
    target_dtype = resolve_dtype(dtype, config)
    with torch.device("meta"), SkipInitialisation():
        whole = Llama(config)
        model = whole if shard is None else Llama(local_config(config, shard.world))
    expected = {checkpoint_name(name): p.shape for name, p in whole.named_parameters()}
    tensors = read_checked_tensors(
        folder, expected, ignore_lm_head=config.tie_word_embeddings, shard=shard
    )
    state = {
        name: tensors[checkpoint_name(name)].to(target_dtype)
        for name, _ in model.named_parameters()
    }
    model.load_state_dict(state, strict=True, assign=True)
    model.requires_grad_(False)
    return model.to(target_device).eval()


class SkipInitialisation(TorchFunctionMode):
    """Makes every `torch.nn.init` call a no-op while the meta skeleton is built.

    Each parameter is replaced by the checkpoint's, so initialising the skeleton is wasted
    work, and not free: `normal_` (nn.Embedding's initialiser) has no meta kernel, and its
    Python fallback imports torch._dynamo, about 2 s of a 2-core machine's start-up.
    """

    def __torch_function__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == torch.nn.init.__name__:
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


def resolve_device(device: str | torch.device) -> torch.device:
    """Turn the `device` argument of `load_checkpoint` into a torch device this machine has.

    Checked here because torch's own errors for a missing GPU ("Torch not compiled with CUDA
    enabled", an invalid device ordinal) come late, from deep inside the first copy.
    """
    try:
        target = torch.device(device)
    except RuntimeError:
        raise ValueError(f"unknown device {device!r} (use 'cpu', 'cuda' or 'cuda:N')") from None
    if target.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} asked for, but torch sees no CUDA device")
        if target.index is not None and target.index >= torch.cuda.device_count():
            count = torch.cuda.device_count()
            raise ValueError(f"device {device!r} asked for, but torch sees {count} CUDA devices")
    elif target.type != "cpu":
        raise ValueError(f"unsupported device {device!r} (use 'cpu', 'cuda' or 'cuda:N')")
    return target


def resolve_dtype(dtype: torch.dtype | str | None, config: LlamaConfig) -> torch.dtype:
    """Turn the `dtype` argument of `load_checkpoint` into a torch dtype."""
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return config.dtype
    if dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r} (use one of {sorted(DTYPES)} or 'auto')")
    return DTYPES[dtype]


def checkpoint_name(parameter_name: str) -> str:
    """Hugging Face keeps the decoder under `model.`; only `lm_head` sits at the top."""
    if parameter_name.startswith("lm_head."):
        return parameter_name
    return f"model.{parameter_name}"


def tensor_locations(folder: Path) -> tuple[Path, dict[str, Path]]:
    """Return (the file that lists the tensors, tensor name -> safetensors file holding it)."""
    index = folder / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return index, {name: folder / file for name, file in weight_map.items()}
    single = folder / SINGLE_FILE
    if single.is_file():
        with safe_open(single, framework="pt") as handle:
            return single, dict.fromkeys(handle.keys(), single)
    raise ValueError(f"{folder}: neither {SINGLE_FILE} nor {INDEX_FILE} found")


def read_checked_tensors(
    folder: Path,
    expected: dict[str, torch.Size],
    *,
    ignore_lm_head: bool,
    shard: Shard | None = None,
) -> dict[str, torch.Tensor]:
    """Check every expected tensor's name and shape across all files, then read them (only
    `shard`'s slice of each, when given)."""
    listing, locations = tensor_locations(folder)
    check_names(listing, locations, expected, ignore_lm_head=ignore_lm_head)
    by_file: dict[Path, list[str]] = {}
    for name in expected:
        by_file.setdefault(locations[name], []).append(name)
    for file, names in by_file.items():
        check_shapes(listing, file, {name: expected[name] for name in names})
    tensors = {}
    for file, names in by_file.items():
        with safe_open(file, framework="pt") as handle:
            for name in names:
                whole = shard is None
                tensors[name] = (
                    handle.get_tensor(name) if whole else read_shard(handle, name, shard)
                )
    return tensors


def check_names(
    listing: Path,
    locations: dict[str, Path],
    expected: dict[str, torch.Size],
    *,
    ignore_lm_head: bool,
) -> None:
    """Every expected tensor must be listed; extra ones mean config and weights disagree.

    Tolerated extras: rotary caches, and a stored `lm_head.weight` for a tied model.
    """
    for name in expected:
        if name not in locations:
            raise ValueError(f"{listing}: missing tensor {name!r}")
    for name, file in locations.items():
        ignorable = name.endswith(IGNORED_SUFFIXES) or (ignore_lm_head and name == "lm_head.weight")
        if name not in expected and not ignorable:
            raise ValueError(f"{file}: unexpected tensor {name!r} (does config.json match?)")


def check_shapes(listing: Path, file: Path, expected: dict[str, torch.Size]) -> None:
    """Read only the headers of `file` and compare each tensor's shape with the model's."""
    if not file.is_file():
        raise ValueError(f"{listing}: lists {file.name}, which does not exist")
    with safe_open(file, framework="pt") as handle:
        stored = set(handle.keys())
        for name, shape in expected.items():
            if name not in stored:
                raise ValueError(f"{file}: missing tensor {name!r}")
            found = torch.Size(handle.get_slice(name).get_shape())
            if found != shape:
                raise ValueError(
                    f"{file}: tensor {name!r} has shape {tuple(found)}, "
                    f"config.json implies {tuple(shape)}"
                )
