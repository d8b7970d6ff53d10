"""Strip what changes between runs and machines from executed notebooks, in place.

`make reports` executes every lesson and then runs this, so a committed notebook changes
only when what it shows changes. It removes execution timestamps, gives cells ids derived
from their position, pins kernel metadata, replaces machine paths (the repository, the
temporary folder, the home folder) in outputs, keeps only the final state of lines that a
progress bar rewrote with carriage returns, joins printed text that the kernel happened to
flush in pieces, drops widget state, and strips trailing whitespace from outputs. Running it
twice changes nothing the second time.

Usage: normalize_notebooks.py [--check] NOTEBOOK...
With --check it rewrites nothing and exits 1 if any notebook is not normalised.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import nbformat

REPO_ROOT = Path(__file__).resolve().parent.parent
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
NOISY_CELL_METADATA = ("execution", "ExecuteTime")
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
PATH_END = r"(?![\w.-])"  # a match must end where the path component ends
MEMORY_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>")


def path_replacements() -> list[tuple[re.Pattern[str], str]]:
    """Machine-specific folders and their stand-ins, the most specific first.

    The repository goes first because it may live under the home or temporary folder.
    Any other path below /tmp is replaced whole, since its name is random.
    """
    folders = [(REPO_ROOT, "<repo>"), (Path.home(), "~")]
    rules = []
    for folder, stand_in in folders:
        for spelling in dict.fromkeys((str(folder), str(folder.resolve()))):
            if spelling != "/":
                rules.append((re.compile(re.escape(spelling) + PATH_END), stand_in))
    for temporary in dict.fromkeys(("/tmp", "/private/tmp", tempfile.gettempdir())):
        rules.append((re.compile(re.escape(temporary) + r"(?:/[\w.+-]+)+"), "<tmp>"))
    return rules


def clean_text(text: str, rules: Sequence[tuple[re.Pattern[str], str]]) -> str:
    """Replace machine paths and object addresses; keep what a terminal would show last."""
    for pattern, stand_in in rules:
        text = pattern.sub(stand_in, text)
    text = MEMORY_ADDRESS.sub(" at 0x...>", text)
    lines = [line.rsplit("\r", 1)[-1].rstrip() for line in text.split("\n")]
    return "\n".join(lines)


def clean_output(
    output: nbformat.NotebookNode, rules: Sequence[tuple[re.Pattern[str], str]]
) -> None:
    """Clean one cell output in place."""
    if output.output_type == "stream":
        output.text = clean_text(output.text, rules)
    elif output.output_type == "error":
        output.evalue = clean_text(output.evalue, rules)
        output.traceback = [clean_text(line, rules) for line in output.traceback]
    else:
        data = output.get("data", {})
        data.pop(WIDGET_MIME, None)
        for mime, value in data.items():
            if mime.startswith("text/") and isinstance(value, str):
                data[mime] = clean_text(value, rules)
    output.get("metadata", {}).pop("execution", None)


def merge_streams(outputs: list[nbformat.NotebookNode]) -> list[nbformat.NotebookNode]:
    """Join consecutive outputs of the same stream into one.

    How printed text is split into outputs depends on when the kernel flushed, which varies
    from run to run; the joined text does not.
    """
    merged: list[nbformat.NotebookNode] = []
    for output in outputs:
        previous = merged[-1] if merged else None
        if (
            previous is not None
            and output.output_type == previous.output_type == "stream"
            and output.name == previous.name
        ):
            previous.text += output.text
        else:
            merged.append(output)
    return merged


def normalize_notebook(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Normalise a notebook in place and return it."""
    rules = path_replacements()
    nb.nbformat_minor = max(nb.nbformat_minor, 5)  # cell ids need nbformat 4.5
    nb.metadata.kernelspec = dict(KERNELSPEC)
    nb.metadata.get("language_info", {}).pop("version", None)
    nb.metadata.pop("widgets", None)
    for index, cell in enumerate(nb.cells):
        cell.id = f"cell-{index:03d}"
        for key in NOISY_CELL_METADATA:
            cell.metadata.pop(key, None)
        if "outputs" in cell:
            cell.outputs = merge_streams(cell.outputs)
        for output in cell.get("outputs", []):
            clean_output(output, rules)
    return nb


def normalized_text(text: str) -> str:
    """The normalised form of a notebook's file contents."""
    nb = normalize_notebook(nbformat.reads(text, as_version=4))
    return nbformat.writes(nb).rstrip("\n") + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    parser.add_argument("--check", action="store_true", help="report, do not rewrite")
    args = parser.parse_args(argv)
    stale = []
    for path in args.notebooks:
        text = path.read_text(encoding="utf-8")
        clean = normalized_text(text)
        if clean == text:
            continue
        stale.append(path)
        if not args.check:
            path.write_text(clean, encoding="utf-8", newline="\n")
    verb = "not normalised" if args.check else "normalised"
    for path in stale:
        print(f"{verb}: {path}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
