"""The README's course map follows the notebooks: its reading times and exercise counts are
what `scripts/course_map.py` counts now."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "course_map.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("course_map", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def test_the_readmes_course_map_is_current() -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True)
    assert result.returncode == 0, result.stderr.decode()


def test_the_counts_read_prose_and_exercises(tmp_path: Path) -> None:
    cells = [
        {"cell_type": "markdown", "source": ["one two three"]},
        {"cell_type": "code", "source": ["from llmengine.lessons.exercises.lesson_99 import a"]},
        {"cell_type": "markdown", "source": ["## Exercises\n", "four five"]},
        {"cell_type": "code", "source": ["from llmengine.lessons.exercises.lesson_99 import a"]},
        {"cell_type": "code", "source": ["from llmengine.lessons.exercises.lesson_99 import b"]},
    ]
    notebook = tmp_path / "99-made-up.ipynb"
    notebook.write_text(json.dumps({"cells": cells}))
    assert load_script().lesson_counts(notebook) == (7, 2)


def test_every_lesson_belongs_to_one_part() -> None:
    parts = load_script().PARTS
    covered = [n for part in parts for n in range(part.first, part.last + 1)]
    lessons = sorted(int(path.name[:2]) for path in (ROOT / "lessons").glob("*.ipynb"))
    assert covered == lessons
