"""The lesson pipeline: where artifacts go, table format, notebook hygiene, the report check."""

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from llmengine.lessons import artifacts

REPO_ROOT = Path(__file__).resolve().parent.parent
COMMITTED_NOTEBOOKS = sorted((REPO_ROOT / "lessons").glob("*.ipynb"))


def load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


normalize = load_script("normalize_notebooks")
check_lessons = load_script("check_lessons")


@pytest.fixture
def artifacts_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "artifacts"
    monkeypatch.setenv(artifacts.ARTIFACTS_ENV, str(root))
    return root


def test_the_environment_variable_redirects_every_artifact(artifacts_root: Path) -> None:
    assert artifacts.figures_dir() == artifacts_root / "figures"
    assert artifacts.reports_dir() == artifacts_root / "reports"
    assert artifacts.figures_dir().is_dir() and artifacts.reports_dir().is_dir()


def test_without_the_variable_artifacts_go_to_the_repository(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(artifacts.ARTIFACTS_ENV, raising=False)
    monkeypatch.chdir(REPO_ROOT / "tests")
    assert artifacts.artifacts_root() == REPO_ROOT


def test_repository_root_is_found_upward_or_explained(tmp_path: Path) -> None:
    assert artifacts.repository_root(REPO_ROOT / "llmengine") == REPO_ROOT
    with pytest.raises(FileNotFoundError, match=artifacts.ARTIFACTS_ENV):
        artifacts.repository_root(tmp_path)


def test_reports_split_deterministic_and_wallclock(artifacts_root: Path) -> None:
    table = artifacts.write_report("cost", "| a |\n| --- |\n\n\n")
    timing = artifacts.write_report("speed.md", "| s |", wallclock=True)
    assert table == artifacts_root / "reports" / "cost.md"
    assert timing == artifacts_root / "reports" / "wallclock" / "speed.md"
    assert table.read_text() == "| a |\n| --- |\n"
    assert timing.read_text() == "| s |\n"


@pytest.mark.parametrize("name", ["", "../up", "a/b", ".hidden"])
def test_artifact_names_must_be_plain(artifacts_root: Path, name: str) -> None:
    with pytest.raises(ValueError, match="plain file name"):
        artifacts.write_report(name, "x")


def test_saved_figures_are_byte_reproducible(artifacts_root: Path) -> None:
    import matplotlib.pyplot as plt

    def draw(name: str) -> bytes:
        artifacts.use_lesson_style()
        fig, ax = plt.subplots()
        ax.plot([1, 2, 3], [2, 1, 3], label="line")
        ax.set_title("title")
        ax.legend()
        path = artifacts.save_figure(fig, name)
        assert path == artifacts_root / "figures" / f"{name}.png"
        return path.read_bytes()

    open_before = plt.get_fignums()
    first, second = draw("one"), draw("two")
    assert first.startswith(b"\x89PNG") and first == second
    assert b"matplotlib" not in first.lower()
    assert plt.get_fignums() == open_before


def test_wallclock_figures_go_to_their_own_folder(artifacts_root: Path) -> None:
    import matplotlib.pyplot as plt

    artifacts.use_lesson_style()
    path = artifacts.save_figure(plt.subplots()[0], "speed", wallclock=True)
    assert path == artifacts_root / "figures" / "wallclock" / "speed.png" and path.is_file()
    assert not (artifacts_root / "figures" / "speed.png").exists()


def test_markdown_table_aligns_and_formats() -> None:
    table = artifacts.markdown_table(
        [(48, "incremental", 0.91234, -0.0001), (8, "reserve|x", float("nan"), 2.5)],
        headers=["pool", "policy", "occupancy", "delta"],
        formats=["d", "", ".1%", ".2f"],
    )
    assert table == (
        "| pool | policy      | occupancy | delta |\n"
        "| ---: | ----------- | --------: | ----: |\n"
        "|   48 | incremental |     91.2% |  0.00 |\n"
        "|    8 | reserve\\|x  |       n/a |  2.50 |\n"
    )


def test_markdown_table_keeps_a_dash_that_is_text() -> None:
    table = artifacts.markdown_table([("-", -0.0001)], headers=["a", "b"], formats=["", ".2f"])
    assert table.splitlines()[2] == "| -   | 0.00 |"


def test_markdown_table_rejects_ragged_input() -> None:
    with pytest.raises(ValueError, match="row 1"):
        artifacts.markdown_table([(1, 2), (3,)], headers=["a", "b"])
    with pytest.raises(ValueError, match="formats"):
        artifacts.markdown_table([(1, 2)], headers=["a", "b"], formats=["d"])


def noisy_notebook() -> str:
    stream = (
        f"saved {REPO_ROOT}/figures/kv.png\n"
        f"cache at {Path.home()}/.cache/x and /tmp/pytest-of-root/pytest-7/t0/r.md   \n"
        "progress 10%\rprogress 100%\n"
        "<object at 0x7f3a2b>\n"
    )
    return json.dumps(
        {
            "cells": [
                {"cell_type": "markdown", "id": "random-a", "metadata": {}, "source": "# Lesson"},
                {
                    "cell_type": "code",
                    "execution_count": 1,
                    "id": "random-b",
                    "metadata": {"execution": {"iopub.execute_input": "2026-11-29T13:00:00Z"}},
                    "outputs": [
                        {"name": "stdout", "output_type": "stream", "text": stream},
                        {"name": "stdout", "output_type": "stream", "text": "flushed later\n"},
                        {"name": "stderr", "output_type": "stream", "text": "warning\n"},
                    ],
                    "source": "print('hi')",
                },
            ],
            "metadata": {
                "kernelspec": {"display_name": ".venv", "language": "python", "name": "python3"},
                "language_info": {"name": "python", "version": "3.11.7"},
            },
            "nbformat": 4,
            "nbformat_minor": 5,
        }
    )


def test_normalizer_strips_machine_noise_and_is_idempotent() -> None:
    clean = normalize.normalized_text(noisy_notebook())
    assert normalize.normalized_text(clean) == clean
    notebook = json.loads(clean)
    assert [cell["id"] for cell in notebook["cells"]] == ["cell-000", "cell-001"]
    assert '"execution": {' not in clean and "3.11.7" not in clean
    assert notebook["metadata"]["kernelspec"]["display_name"] == "Python 3 (ipykernel)"
    stdout, stderr = notebook["cells"][1]["outputs"]
    assert "".join(stdout["text"]) == (
        "saved <repo>/figures/kv.png\n"
        "cache at ~/.cache/x and <tmp>\n"
        "progress 100%\n"
        "<object at 0x...>\n"
        "flushed later\n"
    )
    assert stderr["name"] == "stderr"


def test_normalizer_check_mode_reports_without_rewriting(tmp_path: Path) -> None:
    path = tmp_path / "lesson.ipynb"
    path.write_text(noisy_notebook())
    assert normalize.main(["--check", str(path)]) == 1
    assert normalize.main([str(path)]) == 0
    assert normalize.main(["--check", str(path)]) == 0


@pytest.mark.parametrize("path", COMMITTED_NOTEBOOKS, ids=lambda path: path.name)
def test_committed_notebooks_are_normalised(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert '"execution": {' not in text
    for machine_path in ("/work/", "/root/", "/tmp/", "/home/"):
        assert machine_path not in text, f"{path.name} carries a machine path {machine_path}"
    assert normalize.normalized_text(text) == text, "run scripts/normalize_notebooks.py on it"


def write_tables(folder: Path, tables: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in tables.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def test_report_check_accepts_identical_tables_and_ignores_wallclock(tmp_path: Path) -> None:
    committed = write_tables(tmp_path / "repo", {"a.md": "| 1 |\n", "wallclock/t.md": "9 s\n"})
    produced = write_tables(tmp_path / "run", {"a.md": "| 1 |\n", "wallclock/t.md": "3 s\n"})
    assert check_lessons.compare_reports(produced, committed) == []


def test_report_check_names_a_changed_table_and_shows_the_diff(tmp_path: Path) -> None:
    committed = write_tables(tmp_path / "repo", {"a.md": "| x |\n| 1 |\n", "b.md": "same\n"})
    produced = write_tables(tmp_path / "run", {"a.md": "| x |\n| 2 |\n", "b.md": "same\n"})
    [problem] = check_lessons.compare_reports(produced, committed)
    assert problem.startswith("reports/a.md: differs")
    assert "-| 1 |" in problem and "+| 2 |" in problem


def test_report_check_finds_missing_and_stale_tables(tmp_path: Path) -> None:
    committed = write_tables(tmp_path / "repo", {"old.md": "x\n"})
    produced = write_tables(tmp_path / "run", {"new.md": "y\n"})
    problems = check_lessons.compare_reports(produced, committed)
    assert [problem.split(":")[0] for problem in problems] == ["reports/new.md", "reports/old.md"]
    assert "not committed" in problems[0] and "no lesson writes it" in problems[1]


def test_report_check_main_compares_an_artifacts_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    committed = sorted((REPO_ROOT / "reports").glob("*.md"))
    produced = write_tables(
        tmp_path / "reports", {path.name: path.read_text() for path in committed}
    )
    assert check_lessons.main(["--artifacts", str(produced.parent)]) == 0
    assert f"all {len(committed)} deterministic tables match" in capsys.readouterr().out
    (produced / "extra.md").write_text("x\n")
    assert check_lessons.main(["--artifacts", str(produced.parent)]) == 1
    assert "reports/extra.md" in capsys.readouterr().err
