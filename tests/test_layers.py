"""The package's layers, checked by reading every module's imports (AST, nothing executed).

The serving core sits in `llmengine/` itself and its sub-packages by role (`model`, `speed`,
`kv`, `scheduling`, `structured`, `speculative`, `runner`, `parallel`); `llmengine.bench`,
`llmengine.lessons` and `llmengine.server` sit above it. Dependencies point one way: the core
imports no outer layer and no plotting, dataframe or transformers library at module level,
the bench layer imports neither the lessons nor the server, and the server imports neither
the bench nor the lessons. Inside the core, `CORE_LAYERS` orders the packages and no module
imports from a layer above its own. The front door (`__init__`, `__main__`, the `cli`
package) may reach the outer layers, but only lazily, so that `import llmengine` stays the
core alone.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "llmengine"
OUTER_LAYERS = ("bench", "lessons", "server")
FRONT_DOOR = {"__init__", "__main__", "cli"}
CORE_PACKAGES = (
    "model", "speed", "kv", "scheduling", "parallel", "structured", "speculative", "runner",
)  # fmt: skip
# The core's own layers, lowest first: a module imports only from its own layer or below.
# `*` stands for every module of a package; a name alone is one module. The integer side
# (requests, blocks, the scheduler's decisions) sits at the bottom and knows no tensor; the
# model knows nothing of speed, caches or scheduling; one model runner sits above everything
# a forward needs, the engine above it, tensor parallelism above the engine.
CORE_LAYERS: tuple[tuple[str, ...], ...] = (
    ("params", "engine_config", "outcome", "structured.constraint", "kv.blocks",
     "kv.prefix_cache", "scheduling.*"),
    ("model.*",),
    ("speed.*",),
    ("kv.*",),
    ("structured.*", "sampling", "generation", "prompt_logprobs"),
    ("speculative.*",),
    ("runner.*",),
    ("engine",),
    ("parallel.*",),
)  # fmt: skip
HEAVY_FOR_CORE = ("matplotlib", "pandas", "transformers")


def layer_of(path: Path) -> str:
    """`core`, `front door`, or the name of the outer layer holding the module."""
    relative = path.relative_to(PACKAGE)
    top = relative.parts[0] if len(relative.parts) > 1 else path.stem
    if top in FRONT_DOOR:
        return "front door"
    if len(relative.parts) == 1 or top in CORE_PACKAGES:
        return "core"
    return top


def imports_of(path: Path, *, type_checking: bool = False) -> list[tuple[str, bool]]:
    """Every module `path` imports, with whether the import runs at module level.

    Imports under `if TYPE_CHECKING:` never run, and count only with `type_checking=True`.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []

    def visit(node: ast.AST, top_level: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.Import):
                found.extend((alias.name, top_level) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                found.append((child.module, top_level))
                if child.module == "llmengine":
                    found.extend((f"llmengine.{alias.name}", top_level) for alias in child.names)
            elif isinstance(child, ast.If) and _is_type_checking(child.test) and not type_checking:
                continue  # annotations only: never imported at run time
            visit(child, top_level and not nested)

    visit(tree, True)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"


def outer_layer_named(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "llmengine" and len(parts) > 1 and parts[1] in OUTER_LAYERS:
        return parts[1]
    return None


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_the_package_has_its_layers() -> None:
    layers = {layer_of(path) for path in MODULES}
    assert {"core", "front door", "bench", "lessons", "server"} <= layers


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_one_way(path: Path) -> None:
    layer = layer_of(path)
    for module, top_level in imports_of(path):
        outer = outer_layer_named(module)
        if layer == "core":
            assert outer is None, f"the core module {path.name} imports {module}"
            heavy = module.split(".")[0] in HEAVY_FOR_CORE
            assert not (heavy and top_level), f"{path.name} imports {module} at module level"
        elif layer == "front door":
            assert outer is None or not top_level, f"{path.name} imports {module} eagerly"
        elif layer == "bench":
            assert outer not in ("lessons", "server"), f"bench/{path.name} imports {module}"
        elif layer == "server":
            assert outer not in ("bench", "lessons"), f"server/{path.name} imports {module}"


def core_layer_of(module: str) -> int:
    """The index in `CORE_LAYERS` of a core module named `a.b` (relative to `llmengine`); a
    module named outright wins over its package's `*`."""
    package = module.split(".")[0] + ".*"
    for wanted in (module, package):
        for index, layer in enumerate(CORE_LAYERS):
            if wanted in layer:
                return index
    raise AssertionError(f"llmengine.{module} is in no core layer: add it to CORE_LAYERS")


def core_name(path: Path) -> str | None:
    """`runner.sampler` for llmengine/runner/sampler.py; None outside the core or for a
    package's `__init__` (which only gathers its package's names)."""
    if layer_of(path) != "core" or path.stem == "__init__":
        return None
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts)


def upward_imports(path: Path, name: str) -> list[str]:
    """The core modules that the module `name` (its source at `path`) imports from a layer
    above its own."""
    own, found = core_layer_of(name), []
    for module, _ in imports_of(path, type_checking=True):
        parts = module.split(".")
        if parts[0] != "llmengine" or len(parts) < 2 or parts[1] in OUTER_LAYERS:
            continue
        if len(parts) == 2 and (PACKAGE / parts[1]).is_dir():
            continue  # a package's __init__: the names it gathers are checked where they live
        if core_layer_of(".".join(parts[1:])) > own:
            found.append(module)
    return found


@pytest.mark.parametrize(
    "path", [p for p in MODULES if core_name(p)], ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_no_core_import_runs_from_a_lower_layer_to_a_higher_one(path: Path) -> None:
    name = core_name(path)
    assert upward_imports(path, name) == [], f"{name} imports from a layer above it"


def test_the_layer_check_finds_an_upward_import(tmp_path: Path) -> None:
    """The checker itself: a model module that imported the runner, or the KV storage that
    imported the engine, is caught; one that imports below it is not."""
    source = tmp_path / "sample.py"
    source.write_text(
        "from llmengine.model.config import LlamaConfig\n"
        "if True:\n"
        "    from llmengine.runner.forward import paged_forward\n"
        "def later():\n"
        "    import llmengine.engine\n"
    )
    assert upward_imports(source, "model.loader") == [
        "llmengine.runner.forward",
        "llmengine.engine",
    ]
    assert upward_imports(source, "parallel.engine") == []
    with pytest.raises(AssertionError, match="no core layer"):
        core_layer_of("nowhere.module")


def test_the_scheduler_side_knows_no_tensors() -> None:
    """The scheduler and what it reads import only each other and the standard library."""
    integer_side = {
        "kv.blocks", "kv.prefix_cache", "params", "outcome", "engine_config",
        "scheduling.request", "scheduling.scheduler", "scheduling.decision",
        "scheduling.policy", "scheduling.block_manager", "scheduling.swap_space",
        "scheduling.rules", "scheduling.preemption", "scheduling.step_bookkeeping",
        "structured.constraint",
    }  # fmt: skip
    for name in integer_side:
        path = PACKAGE.joinpath(*name.split(".")).with_suffix(".py")
        for module, _ in imports_of(path, type_checking=True):
            top, _, rest = module.partition(".")
            if top == "llmengine":
                assert rest in integer_side, f"{name}.py imports {module}"
            else:
                assert top in sys.stdlib_module_names or top == "__future__", (
                    f"{name}.py imports {module}"
                )


def test_the_model_a_reader_meets_knows_nothing_of_caches_scheduling_or_speed() -> None:
    """The Llama, its configuration and rotary embedding import only one another."""
    plain = {"model.llama", "model.config", "model.rope"}
    for name in plain:
        path = PACKAGE.joinpath(*name.split(".")).with_suffix(".py")
        for module, _ in imports_of(path, type_checking=True):
            top, _, rest = module.partition(".")
            assert top != "llmengine" or rest in plain, f"{name} imports {module}"


def test_every_core_package_holds_core_modules() -> None:
    for package in CORE_PACKAGES:
        modules = list((PACKAGE / package).glob("*.py"))
        assert modules and all(layer_of(path) == "core" for path in modules), package


def test_the_layer_walk_sees_imports_in_every_place(tmp_path: Path) -> None:
    """The checker itself: a nested import, an aliased one and a TYPE_CHECKING one."""
    source = tmp_path / "sample.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "import matplotlib\n"
        "from llmengine import lessons\n"
        "if TYPE_CHECKING:\n"
        "    import pandas\n"
        "def run():\n"
        "    from llmengine.bench.batchbench import sweep_pool_sizes\n"
    )
    found = imports_of(source)
    assert ("matplotlib", True) in found
    assert ("llmengine.lessons", True) in found
    assert ("llmengine.bench.batchbench", False) in found
    assert all(module != "pandas" for module, _ in found)
    assert ("pandas", True) in imports_of(source, type_checking=True)


def test_import_llmengine_loads_only_the_core() -> None:
    """In a fresh interpreter: no outer layer, no transformers, matplotlib or pandas."""
    code = (
        "import sys, llmengine\n"
        "bad = [m for m in sys.modules if m.startswith(('llmengine.bench', 'llmengine.lessons',"
        " 'llmengine.server', 'fastapi', 'transformers', 'matplotlib', 'pandas'))]\n"
        "print(','.join(sorted(bad)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_bench_names_still_reach_from_the_front_door() -> None:
    import llmengine
    from llmengine.bench.batchbench import sweep_pool_sizes

    assert llmengine.sweep_pool_sizes is sweep_pool_sizes
    assert "uniform_burst" in dir(llmengine)
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        _ = llmengine.nothing_here
