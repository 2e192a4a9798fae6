"""The configuration reference page (docs/config-reference.md), written from the settings tree.

Every key's description lives on its pydantic field and nowhere else, so the page is rendered
from the fields (key, type, default, description) rather than kept by hand beside them;
tests/config/test_config_reference.py holds the committed page equal to this rendering, and
the docs build (docs/hooks.py) refuses a stale one.

    python -m cpr_ray.config.reference docs/config-reference.md
"""

from __future__ import annotations

import inspect
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined, to_jsonable_python

from cpr_ray.config.tree import Config
from cpr_ray.sections import Section

PAGE = "docs/config-reference.md"
COMMAND = f"python -m cpr_ray.config.reference {PAGE}"


def type_name(annotation: Any) -> str:
    """A field's type as a YAML writer thinks of it: `int | null`, `"fail" | "quarantine"`."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin is typing.Annotated:  # a named constraint (`sections.Count`): its type
        return type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if annotation is type(None):
        return "null"
    if origin in (dict, list, tuple):
        inner = ", ".join("…" if a is Ellipsis else type_name(a) for a in args)
        return f"{origin.__name__}[{inner}]"
    if isinstance(annotation, type) and issubclass(annotation, Section):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


def default_text(field: FieldInfo) -> str:
    """The default as JSON (valid YAML); empty for a required field."""
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, Section):
        return "its section's defaults"
    return f"`{json.dumps(to_jsonable_python(value), ensure_ascii=False)}`"


def section_doc(cls: type[Section]) -> str:
    """What a section is for: its class docstring, else its module's (one module per section)."""
    doc = cls.__dict__.get("__doc__") or sys.modules[cls.__module__].__doc__ or ""
    return inspect.cleandoc(doc)


def nested_sections(annotation: Any) -> list[tuple[str, type[Section]]]:
    """The sections a field holds and the key suffix under which each appears: `""` for the
    section itself, `.<name>` for a dict of sections, `[]` for a list of them."""
    if isinstance(annotation, type) and issubclass(annotation, Section):
        return [("", annotation)]
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return [found for a in args for found in nested_sections(a)]
    if origin is dict:
        key = args[0]
        label = "<stage>" if typing.get_origin(key) is Literal else "<name>"
        return [(f".{label}{s}", c) for s, c in nested_sections(args[1])]
    if origin is list:
        return [(f"[]{s}", c) for s, c in nested_sections(args[0])]
    return []


def undocumented(cls: type[Section], path: str = "") -> list[str]:
    """Keys without a description and sections without a docstring, under `cls`: what the page
    would print blank."""
    missing = [path or cls.__name__] if not section_doc(cls) else []
    for name, field in cls.model_fields.items():
        key = f"{path}.{name}" if path else name
        inner = nested_sections(field.annotation)
        if not field.description and not inner:
            missing.append(key)
        missing += [m for suffix, c in inner for m in undocumented(c, key + suffix)]
    return missing


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _section_block(path: str, cls: type[Section], done: dict[type, str]) -> list[str]:
    """The heading, purpose and key table of one section, then the sections nested in it."""
    done[cls] = path
    lines = [f"## `{path}`", "", section_doc(cls), ""]
    lines += ["| key | type | default | description |", "|---|---|---|---|"]
    later: list[tuple[str, type[Section]]] = []
    for name, field in cls.model_fields.items():
        description = field.description or ""
        for suffix, inner in nested_sections(field.annotation):
            inner_path = f"{path}.{name}{suffix}"
            if inner in done:
                description += f" Its keys are those of `{done[inner]}`."
            else:
                description += f" Its keys: `{inner_path}` below."
                later.append((inner_path, inner))
        row = [f"`{name}`", type_name(field.annotation), default_text(field), description]
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    lines.append("")
    for inner_path, inner in later:
        lines += _section_block(inner_path, inner, done)
    return lines


def render() -> str:
    """The whole page: the top-level keys, then each section in the tree's order."""
    lines = [
        "# Configuration reference",
        "",
        "<!-- generated by `" + COMMAND + "` from the fields of `cpr_ray/config/`; "
        "do not edit by hand -->",
        "",
        "Every key of the settings tree, with its type, default and description, as the code "
        "declares them. A key is set in a profile, a YAML file, a `CPR_SECTION__KEY` "
        "environment variable or `--set section.key=value` "
        "([where values come from](configuration.md)). Defaults are the tree's own; a profile "
        "(`cpr_ray/profiles/`) may change them.",
        "",
    ]
    done: dict[type, str] = {}
    top = ["| key | type | default | description |", "|---|---|---|---|"]
    sections: list[tuple[str, type[Section]]] = []
    for name, field in Config.model_fields.items():
        inner = nested_sections(field.annotation)
        if inner:
            sections += [(f"{name}{suffix}", cls) for suffix, cls in inner]
            continue
        row = [f"`{name}`", type_name(field.annotation), default_text(field), field.description]
        top.append("| " + " | ".join(_cell(c or "") for c in row) + " |")
    lines += ["## Top level", "", *top, ""]
    for path, cls in sections:
        lines += _section_block(path, cls, done)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> None:
    """Write the page to the path given (docs/config-reference.md from the repository root)."""
    args = sys.argv[1:] if argv is None else argv
    Path(args[0] if args else PAGE).write_text(render(), encoding="utf-8")


if __name__ == "__main__":
    main()
