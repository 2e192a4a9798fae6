"""Versioned prompt files, rendered with untrusted text kept inside its data block.

A prompt's version is part of every cache key and every output row: editing a prompt means
adding `NAME.vN+1.txt`, so earlier answers are never mistaken for answers to the new wording.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from string import Template

_DELIMITER = re.compile(r"</?\s*data\s*>", re.I)
MAX_FIELD_CHARS = 4000


@dataclass(frozen=True)
class Prompt:
    name: str
    version: str
    template: str

    @property
    def id(self) -> str:
        return f"{self.name}.{self.version}"

    def render(self, **values: str) -> str:
        """Fill the template; every value is untrusted text, stripped of our data delimiters."""
        clean = {k: _DELIMITER.sub(" ", str(v))[:MAX_FIELD_CHARS] for k, v in values.items()}
        return Template(self.template).substitute(clean)


@cache
def load(name: str, version: str = "v1") -> Prompt:
    path = resources.files("cpr_ray.llm") / "prompts" / f"{name}.{version}.txt"
    if not path.is_file():
        raise FileNotFoundError(f"no prompt {name}.{version} in cpr_ray/llm/prompts")
    return Prompt(name, version, path.read_text())
