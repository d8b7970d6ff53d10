"""A draft model's checkpoint made of another's first layers: the cheapest draft there is.

`save_self_draft` cuts a checkpoint down to its first layers (with its embedding, final norm,
head and tokenizer files), for a model that has no smaller sibling to guess its tokens. The
draft itself runs inside the model runner (`llmengine.runner.draft`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

WEIGHTS = "model.safetensors"


def save_self_draft(source: str | Path, target: str | Path, num_layers: int) -> Path:
    """A draft checkpoint at `target` made of the first `num_layers` layers of the one at
    `source` (with its embedding, final norm, head and tokenizer files): the cheapest draft
    there is, with no training. Returns `target`."""
    source, target = Path(source), Path(target)
    config = json.loads((source / "config.json").read_text())
    if not 1 <= num_layers < config["num_hidden_layers"]:
        raise ValueError(
            f"a self-draft keeps between 1 and {config['num_hidden_layers'] - 1} layers, "
            f"not {num_layers}"
        )
    weights: dict[str, torch.Tensor] = {}
    for shard in sorted(source.glob("*.safetensors")):
        weights.update(load_file(shard))
    kept = {
        name: tensor
        for name, tensor in weights.items()
        if not name.startswith("model.layers.") or int(name.split(".")[2]) < num_layers
    }
    target.mkdir(parents=True, exist_ok=True)
    save_file(kept, target / WEIGHTS, metadata={"format": "pt"})
    (target / "config.json").write_text(json.dumps({**config, "num_hidden_layers": num_layers}))
    for path in source.glob("*.json"):  # the tokenizer's files and the generation config
        if path.name != "config.json" and not path.name.endswith(".index.json"):
            shutil.copy(path, target / path.name)
    return target
