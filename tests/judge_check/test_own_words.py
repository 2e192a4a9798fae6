"""Text of our own (issue 44): no shipped prompt, gold file, package docstring or the judging
rules' README shares a run of 10 words with the method's text (`../shared/METHOD.md`, beside
the checkout as in CI). We learn from it and write our own."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
METHOD = ROOT.parent / "shared" / "METHOD.md"
RUN = 10
_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)?")


def _words(text: str) -> list[str]:
    return [w.lower().replace("’", "'") for w in _WORD.findall(text)]


def _runs(text: str) -> set[tuple[str, ...]]:
    words = _words(text)
    return {tuple(words[i : i + RUN]) for i in range(len(words) - RUN + 1)}


def _docstrings(path: Path) -> str:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = [tree, *ast.walk(tree)]
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return "\n".join(ast.get_docstring(n) or "" for n in nodes if isinstance(n, kinds))


def _shipped() -> dict[str, str]:
    texts = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8")
             for p in sorted((ROOT / "cpr_ray/llm/prompts").glob("*.txt"))}  # fmt: skip
    for p in sorted((ROOT / "cpr_ray/judge_check/gold").glob("*.jsonl")):
        texts[str(p.relative_to(ROOT))] = p.read_text(encoding="utf-8")
    for p in sorted((ROOT / "cpr_ray").rglob("*.py")):
        texts[f"{p.relative_to(ROOT)} (docstrings)"] = _docstrings(p)
    readme = ROOT / "cpr_ray/queries/README.md"
    texts[str(readme.relative_to(ROOT))] = readme.read_text(encoding="utf-8")
    return texts


@pytest.mark.skipif(
    not METHOD.is_file(), reason=f"the method's text is not beside the checkout ({METHOD})"
)
def test_no_shipped_text_shares_ten_words_with_the_method():
    method = _runs(METHOD.read_text(encoding="utf-8"))
    shared = {}
    for name, text in _shipped().items():
        runs = _runs(text) & method
        if runs:
            shared[name] = " ".join(sorted(runs)[0])
    assert not shared, shared
