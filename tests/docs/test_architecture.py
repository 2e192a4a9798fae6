"""docs/architecture.md lists the package's rooms and root modules as the tree holds them.

The rooms are derived from the package itself (every folder of `cpr_ray/`, every module at its
root), so a room added, renamed or removed without the page saying so fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "cpr_ray"
PAGE = ROOT / "docs" / "architecture.md"
_ROW = re.compile(r"^\| `([\w.]+/?)` \|", re.M)


def rooms_in_package(package: Path) -> set[str]:
    """`room/` for each folder of the package, `module.py` for each module at its root."""
    folders = {f"{p.name}/" for p in package.iterdir() if p.is_dir() and p.name != "__pycache__"}
    modules = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    return folders | modules


def rooms_on_page(text: str) -> set[str]:
    """The first cell of each table row naming a room or module."""
    return set(_ROW.findall(text))


def test_the_page_lists_every_room_and_root_module_and_no_other():
    on_page = rooms_on_page(PAGE.read_text(encoding="utf-8"))
    in_package = rooms_in_package(PACKAGE)
    assert sorted(in_package - on_page) == [], "rooms the page does not describe"
    assert sorted(on_page - in_package) == [], "rooms the page names that the package lacks"


def test_the_comparison_sees_a_new_room_and_a_gone_one(tmp_path):
    package = tmp_path / "cpr_ray"
    for name in ("storage", "tables", "__pycache__"):
        (package / name).mkdir(parents=True)
    (package / "errors.py").write_text("")
    (package / "__init__.py").write_text("")
    assert rooms_in_package(package) == {"storage/", "tables/", "errors.py"}
    page = "| `storage/` | the client |\n| `errors.py` | the contract |\n| `gone/` | moved |\n"
    assert rooms_in_package(package) - rooms_on_page(page) == {"tables/"}
    assert rooms_on_page(page) - rooms_in_package(package) == {"gone/"}


def test_the_page_says_what_search_takes_from_evaluate():
    """The page once said search imports nothing from evaluate; it takes the BEIR loader."""
    sources = [p.read_text(encoding="utf-8") for p in (PACKAGE / "search").rglob("*.py")]
    found = (re.findall(r"^\s*from cpr_ray\.evaluate\.([\w.]+) import", s, re.M) for s in sources)
    imports = {module for modules in found for module in modules}
    assert imports, "search imports nothing from evaluate now: say so on the page"
    text = PAGE.read_text(encoding="utf-8")
    assert "imports nothing from `evaluate`" not in text
    for module in imports:
        assert f"`evaluate.{module}`" in text, module
