"""Where lessons put their figures and tables, and how those look.

Every lesson writes through this module so that one switch moves all of its output:
`LLMENGINE_ARTIFACTS=<folder>` sends figures and reports there instead of the repository
(`make test` uses it to run the lessons without touching committed files). Figures are PNG
files with fixed size, font and metadata, tables are Markdown from one formatter, so
rerunning a lesson on another machine rewrites the same bytes.

Tables and figures whose numbers are wall-clock measurements are written with
`wallclock=True`, to `reports/wallclock/` and `figures/wallclock/`: they are kept for reading,
never compared. Everything else must come out the same on every machine.

matplotlib is imported inside the functions that need it: `import llmengine` works without it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ARTIFACTS_ENV = "LLMENGINE_ARTIFACTS"
FIGURE_DPI = 100
FIGURE_SIZE = (6.4, 4.0)
FONT_FAMILY = "DejaVu Sans"  # ships with matplotlib, so every machine renders the same glyphs
WALLCLOCK_DIR = "wallclock"


def repository_root(start: Path | None = None) -> Path:
    """The nearest folder at or above `start` (default: the current one) holding the project.

    The project's root is recognised by `pyproject.toml` beside the `llmengine/` package.
    Lessons run with their own folder as the current one, so the search walks upward.
    """
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "pyproject.toml").is_file() and (folder / "llmengine").is_dir():
            return folder
    raise FileNotFoundError(
        f"no llmengine repository (pyproject.toml beside llmengine/) at or above {here}; "
        f"set {ARTIFACTS_ENV} to the folder that should receive figures/ and reports/"
    )


def artifacts_root() -> Path:
    """`$LLMENGINE_ARTIFACTS` when set, else the repository root."""
    override = os.environ.get(ARTIFACTS_ENV)
    return Path(override) if override else repository_root()


def _subdir(*parts: str) -> Path:
    folder = artifacts_root().joinpath(*parts)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def figures_dir(wallclock: bool = False) -> Path:
    """The folder for deterministic figures, or for wall-clock ones with `wallclock=True`."""
    return _subdir("figures", WALLCLOCK_DIR) if wallclock else _subdir("figures")


def reports_dir(wallclock: bool = False) -> Path:
    """The folder for deterministic tables, or for wall-clock ones with `wallclock=True`."""
    return _subdir("reports", WALLCLOCK_DIR) if wallclock else _subdir("reports")


def _file_name(name: str, suffix: str) -> str:
    stem = name.removesuffix(suffix)
    if not stem or "/" in stem or "\\" in stem or stem.startswith("."):
        raise ValueError(f"artifact name {name!r} must be a plain file name such as 'kv_cost'")
    return stem + suffix


def use_lesson_style() -> None:
    """Select the Agg backend and the lessons' fixed font and sizes.

    Call it once at the top of a lesson, before drawing: the same style on every machine is
    what makes saved figures byte-for-byte reproducible.
    """
    import matplotlib

    matplotlib.use("Agg", force=True)
    matplotlib.rcdefaults()
    matplotlib.rcParams.update(
        {
            "font.family": "sans-serif",
            "font.sans-serif": [FONT_FAMILY],
            "font.size": 10,
            "axes.titlesize": 11,
            "axes.labelsize": 10,
            "legend.fontsize": 9,
            "xtick.labelsize": 9,
            "ytick.labelsize": 9,
            "figure.figsize": FIGURE_SIZE,
            "figure.dpi": FIGURE_DPI,
            "figure.constrained_layout.use": True,
            "savefig.dpi": FIGURE_DPI,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "svg.hashsalt": "llmengine",
        }
    )


def save_figure(fig: Figure, name: str, wallclock: bool = False) -> Path:
    """Write `fig` to `figures/NAME.png` with reproducible bytes, close it, return the path.

    A figure that plots wall-clock measurements passes `wallclock=True` and goes to
    `figures/wallclock/NAME.png`. The PNG carries no software version or timestamp. The
    figure is closed because under Agg it cannot be shown anyway; to see it in a notebook,
    display the returned file (`IPython.display.Image(filename=path)`), which shows exactly
    the committed bytes.
    """
    import matplotlib.pyplot as plt

    path = figures_dir(wallclock) / _file_name(name, ".png")
    fig.savefig(path, format="png", dpi=FIGURE_DPI, metadata={"Software": None})
    plt.close(fig)
    return path


def write_report(name: str, markdown_text: str, wallclock: bool = False) -> Path:
    """Write a Markdown table to `reports/NAME.md` (or `reports/wallclock/NAME.md`).

    Deterministic reports are compared against the committed ones by `make test`; anything
    that depends on how fast this machine is must pass `wallclock=True`.
    """
    path = reports_dir(wallclock) / _file_name(name, ".md")
    path.write_text(markdown_text.rstrip("\n") + "\n", encoding="utf-8", newline="\n")
    return path


def _format_cell(value: Any, spec: str) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    text = format(value, spec)
    # A value that rounds to zero from below prints as "-0.00" on some runs and "0.00" on
    # others; one spelling keeps the committed tables stable.
    if _is_number(value) and text.startswith("-") and text[1:].strip("0.") == "":
        text = text[1:]
    return text.replace("|", "\\|")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(slots=True)
class _Column:
    """One table column: its header, formatted cells, and whether it is right-aligned."""

    header: str
    cells: list[str]
    numeric: bool
    width: int = field(init=False)

    def __post_init__(self) -> None:
        self.width = max(3, len(self.header), *(len(cell) for cell in self.cells))

    def pad(self, text: str) -> str:
        return text.rjust(self.width) if self.numeric else text.ljust(self.width)

    def rule(self) -> str:
        return "-" * (self.width - 1) + ":" if self.numeric else "-" * self.width


def markdown_table(
    rows: Sequence[Sequence[Any]],
    headers: Sequence[str],
    formats: Sequence[str] | None = None,
) -> str:
    """Format rows as a Markdown pipe table, the one table style of every lesson.

    `formats` holds one `format()` spec per column (for example `"d"`, `".3f"`, `".1%"`, or
    `""` for `str()`). Columns whose values are all numbers are right-aligned. NaN prints as
    `n/a`. The returned text ends with a newline.
    """
    width = len(headers)
    specs = list(formats) if formats is not None else [""] * width
    if len(specs) != width:
        raise ValueError(f"{len(specs)} formats for {width} columns")
    for index, row in enumerate(rows):
        if len(row) != width:
            raise ValueError(f"row {index} has {len(row)} cells, the table has {width} columns")
    columns = [
        _Column(
            header=str(header).replace("|", "\\|"),
            cells=[_format_cell(row[col], specs[col]) for row in rows],
            numeric=bool(rows) and all(_is_number(row[col]) for row in rows),
        )
        for col, header in enumerate(headers)
    ]
    lines = [
        [column.pad(column.header) for column in columns],
        [column.rule() for column in columns],
        *([column.pad(column.cells[index]) for column in columns] for index in range(len(rows))),
    ]
    return "".join("| " + " | ".join(line) + " |\n" for line in lines)


def show_table(table: str, name: str | None = None, wallclock: bool = False) -> None:
    """Show a Markdown table as a rendered table in the notebook (and on GitHub), and, given a
    `name`, write it to `reports/` as `write_report` does. A printed table would show as
    monospace pipes; displayed as Markdown it renders wherever the notebook is read."""
    from IPython.display import Markdown, display

    if name is not None:
        write_report(name, table, wallclock=wallclock)
    display(Markdown(table))


MACHINE_PREFIX = "Measured on: "
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile")


def machine_line() -> str:
    """One line naming what a lesson's wall-clock numbers depend on: the processor, its vector
    extensions, the threads torch uses and the load when the cell ran."""
    from llmengine.bench.throughput import cpu_model

    cpuinfo = Path("/proc/cpuinfo")
    flags: set[str] = set()
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    import torch

    isa = ", ".join(flag for flag in ISA_FLAGS if flag in flags) or "none of " + "/".join(ISA_FLAGS)
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    threads = torch.get_num_threads()
    return (
        f"{MACHINE_PREFIX}{cpu_model()} ({os.cpu_count()} logical CPUs; {isa}); "
        f"torch {torch.__version__} on {threads} thread{'s' if threads > 1 else ''}; "
        f"load average {load}"
    )


def show_machine() -> None:
    """Show `machine_line()` beside a lesson's wall-clock numbers: every lesson that measures
    time prints it, so a reader knows which machine the numbers belong to."""
    from IPython.display import Markdown, display

    display(Markdown(machine_line()))
