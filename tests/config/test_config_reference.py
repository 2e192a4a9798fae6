"""The configuration reference (docs/config-reference.md) is the config's own descriptions.

The page is rendered from the pydantic fields of `cpr_ray/config/`; a key added, renamed or
redescribed in the code without rewriting the page would leave the docs describing another
config, and a key without a description would print a blank row."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from cpr_ray.config.reference import COMMAND, PAGE, render, undocumented
from cpr_ray.config.tree import Config
from cpr_ray.sections import Section

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_page_is_the_current_rendering():
    assert (ROOT / PAGE).read_text(encoding="utf-8") == render(), f"stale: run `{COMMAND}`"


def test_every_key_and_section_has_a_description():
    assert undocumented(Config) == []


def test_a_key_without_a_description_is_named():
    class Inner(Section):
        """A nested section."""

        bare: int = 1

    class Outer(Section):
        """An outer section."""

        said: int = Field(2, description="A described key.")
        inner: Inner = Inner()
        by_name: dict[str, Inner] = Field({}, description="Inner sections by name.")

    assert undocumented(Outer) == ["inner.bare", "by_name.<name>.bare"]


def test_a_row_carries_the_fields_type_default_and_description():
    page = render()
    field = Config.model_fields["ingest"].annotation.model_fields["on_corrupt_shard"]
    row = next(line for line in page.splitlines() if line.startswith("| `on_corrupt_shard` |"))
    assert '"fail" \\| "quarantine"' in row and '`"fail"`' in row
    assert " ".join(field.description.split()) in row
    # a nested section is listed under its own key path, and one seen before is referred to
    assert "## `llm.stages.<stage>`" in page and "## `pooling.poolers[]`" in page
    assert "Its keys are those of `encoder`." in page
