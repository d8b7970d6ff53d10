"""Docstrings and comments in `llmengine` say what the code does and why, in the present tense.

A comment that points at an issue number ("issue 13") or tells the code's history ("as
before", "until now", "was measured") sends a newcomer to a tracker or a past they cannot see;
the reason belongs in the comment itself. Every .py under the package is read: docstrings
found with `ast`, comments with `tokenize`, each hit reported as `file:line: phrase: text`.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "llmengine"
HISTORY = re.compile(r"\b(?:issue \d+|as before|until now|was measured)\b", re.IGNORECASE)

_Span = tuple[tuple[int, int], tuple[int, int]]


def _docstring_spans(tree: ast.Module) -> list[_Span]:
    """Where each docstring's string literal stands: ((line, column), (end line, end column))."""
    spans = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if ast.get_docstring(node, clean=False) is None:
            continue
        literal = node.body[0]
        assert literal.end_lineno is not None and literal.end_col_offset is not None
        spans.append(
            ((literal.lineno, literal.col_offset), (literal.end_lineno, literal.end_col_offset))
        )
    return spans


def history_phrases(source: str) -> list[tuple[int, str, str]]:
    """`(line, phrase, the line's text)` for each history phrase in a docstring or comment.

    Tokens, not the parsed docstring, give the lines: a docstring's text is read as it stands
    in the file, so its line numbers are the file's even where it holds escapes.
    """
    spans = _docstring_spans(ast.parse(source))
    hits = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        in_docstring = token.type == tokenize.STRING and any(
            start <= token.start and token.end <= end for start, end in spans
        )
        if token.type != tokenize.COMMENT and not in_docstring:
            continue
        for offset, text in enumerate(token.string.splitlines()):
            hits.extend(
                (token.start[0] + offset, match.group(0), text.strip())
                for match in HISTORY.finditer(text)
            )
    return hits


def package_hits(package: Path) -> list[str]:
    """Every hit under `package`, as `path:line: 'phrase': text`, path relative to its parent."""
    return [
        f"{path.relative_to(package.parent)}:{line}: {phrase!r}: {text}"
        for path in sorted(package.rglob("*.py"))
        for line, phrase, text in history_phrases(path.read_text(encoding="utf-8"))
    ]


def test_no_docstring_or_comment_in_the_package_tells_history() -> None:
    hits = package_hits(PACKAGE)
    assert not hits, "say what and why, not the history:\n" + "\n".join(hits)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('"""Fixed in issue 13."""\n', [(1, "issue 13")]),
        ('"""One line.\n\nThe second paragraph: as before.\n"""\n', [(3, "as before")]),
        ("x = 1  # Until now this was slower\n", [(1, "Until now")]),
        ("class A:\n    '''Tidy.'''\n\n    # it was measured once\n", [(4, "was measured")]),
        ("def f():\n    r'''\\n\n    ISSUE 7\n    '''\n", [(3, "ISSUE 7")]),
        ("async def f():\n    '''as before'''\n", [(2, "as before")]),
        # Ordinary strings and code are not comments: only docstrings and comments count.
        ('x = "issue 13"\n', []),
        ('def f():\n    y = 1\n    """as before"""\n', []),
        ("issue_13 = 'until now'\n", []),
        ("# the tissue 5 and aliases before\n", []),
        ('"""A present-tense docstring."""\n# and why it is so\n', []),
    ],
)
def test_history_phrases_finds_docstrings_and_comments(
    source: str, expected: list[tuple[int, str]]
) -> None:
    assert [(line, phrase) for line, phrase, _ in history_phrases(source)] == expected


def test_a_hit_names_its_file_line_and_phrase(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text('"""Clean."""\n')
    (package / "sub" / "mod.py").write_text('"""Clean.\n\nSlower, as before.\n"""\n')
    assert package_hits(package) == ["pkg/sub/mod.py:3: 'as before': Slower, as before."]
