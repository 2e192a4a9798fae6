"""MkDocs hooks of the docs site (mkdocs.yml).

The operator's walk-through stays beside the manifests it applies (`infra/README.md`, where an
operator with the repository open reads it); the site shows the same file as a page of its own.

The configuration reference is rendered from the settings tree's fields
(`cpr_ray/config/reference.py`); a page that no longer matches the code would document keys that
are gone or miss new ones, so the build stops with the command that rewrites it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

from cpr_ray.config.reference import COMMAND, PAGE, render

WALKTHROUGH = "infra/README.md"


def on_pre_build(config: Any, **kwargs: Any) -> None:
    page = Path(config["config_file_path"]).parent / PAGE
    if not page.is_file() or page.read_text(encoding="utf-8") != render():
        raise PluginError(f"{PAGE} is not the config's current reference: run `{COMMAND}`")


def on_files(files: Files, config: Any, **kwargs: Any) -> Files:
    text = (Path(config["config_file_path"]).parent / WALKTHROUGH).read_text(encoding="utf-8")
    files.append(File.generated(config, "walkthrough.md", content=text))
    return files
