"""The operator's walk-through (infra/README.md, "Day one") stays true to the code.

Each step names the test that runs its code or files here; a renamed or deleted test would
leave the walk-through promising a check that no longer exists. Each `cpr …` and
`python jobs/….py …` line in the operator's documents must use a command and flags the code
has: a flag renamed in the CLI would otherwise stop an operator at the step that uses it.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
from pathlib import Path

import click
import pytest
import typer
import yaml

from cpr_ray.cpr_command import app

ROOT = Path(__file__).resolve().parents[2]
# the docs site (docs/) is one document here: the command lines the README held moved into its
# pages, each page holding a few or none
DOCS = [ROOT / "infra" / "README.md", ROOT / "README.md", ROOT / "docs"]
TEST_REF = re.compile(r"`(tests/(?:\w+/)?test_\w+\.py)::(test_\w+)`")


def _day_one() -> str:
    text = (ROOT / "infra" / "README.md").read_text()
    start = text.index("## Day one")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def _table_rows(section: str) -> list[list[str]]:
    rows = [line for line in section.splitlines() if re.match(r"\| \d+ \|", line)]
    return [[cell.strip() for cell in row.strip("|").split(" | ")] for row in rows]


def test_every_step_names_tests_that_exist():
    rows = _table_rows(_day_one())
    assert len(rows) >= 10, "the walk-through lost its steps"
    missing = []
    for row in rows:
        refs = TEST_REF.findall(row[-1])
        assert refs, f"step {row[0]} ({row[1]}) names no test"
        for file, name in refs:
            source = ROOT / file
            if not source.is_file() or not re.search(rf"^def {name}\(", source.read_text(), re.M):
                missing.append(f"step {row[0]}: {file}::{name}")
    assert missing == []


def test_the_reference_check_can_fail(tmp_path):
    row = "| 1 | x | y | z | `tests/pipeline/test_walkthrough.py::test_that_does_not_exist` |"
    ((file, name),) = TEST_REF.findall(row)
    assert not re.search(rf"^def {name}\(", (ROOT / file).read_text(), re.M)


def _text(doc: Path) -> str:
    """A document's text: a file's, or every page of the docs site in turn."""
    pages = sorted(doc.glob("*.md")) if doc.is_dir() else [doc]
    return "\n".join(page.read_text() for page in pages)


def _command_lines(text: str) -> list[str]:
    """Command lines inside the documents' code blocks, continuation lines joined."""
    lines = []
    for block in re.findall(r"```(?:bash|sh)?\n(.*?)```", text, re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split("  #")[0].strip()
            if re.match(r"(cpr |.*python jobs/)", line):
                lines.append(line)
    return lines


def _words(line: str) -> list[str]:
    try:
        return shlex.split(line.replace("…", "X"))
    except ValueError:  # an unbalanced quote in a shortened example
        return line.split()


def _flags(words: list[str]) -> list[str]:
    """The long options of a command line, those in an optional `[--flag …]` too."""
    words = [w.lstrip("[").rstrip("]") for w in words]
    return [w.split("=")[0] for w in words if w.startswith("--")]


COMMANDS: click.Group = typer.main.get_command(app)  # type: ignore[assignment]


def _cpr_problems(words: list[str]) -> list[str]:
    name = next((w for w in words[1:] if not w.startswith("-")), None)
    command = COMMANDS.commands.get(name or "")
    if command is None:
        return [f"cpr has no command {name!r}"]
    known = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    return [f"cpr {name} has no {flag}" for flag in _flags(words) if flag not in known]


class _Parsed(Exception):
    """Raised in place of parsing, carrying the parser a job built."""


def _job_options(script: str) -> set[str]:
    """The options of a job's argument parser, taken from the parser its `main` builds (the
    jobs build theirs from the same flag tables as the CLI, so the source does not list them)."""
    spec = importlib.util.spec_from_file_location(f"job_{Path(script).stem}", ROOT / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def capture(parser: argparse.ArgumentParser, *args, **kwargs):
        raise _Parsed(parser)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", capture)
        with pytest.raises(_Parsed) as parsed:
            module.main([])
    return set(parsed.value.args[0]._option_string_actions)


def _job_problems(words: list[str]) -> list[str]:
    script = next(w for w in words if w.startswith("jobs/"))
    if not (ROOT / script).is_file():
        return [f"{script} does not exist"]
    known = _job_options(script)
    after = words[words.index(script) + 1 :]
    return [f"{script} has no {flag}" for flag in _flags(after) if flag not in known]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_command_lines_use_commands_and_flags_the_code_has(doc):
    lines = _command_lines(_text(doc))
    assert lines, f"no command lines found in {doc}"
    problems = []
    for line in lines:
        words = _words(line)
        if words[0] == "cpr":
            problems += [f"{p}: {line}" for p in _cpr_problems(words)]
        elif any(w.startswith("jobs/") for w in words):
            problems += [f"{p}: {line}" for p in _job_problems(words)]
    assert problems == []


def test_the_flag_check_can_fail():
    assert _cpr_problems(["cpr", "build", "--config", "x", "--no-such-flag"]) == [
        "cpr build has no --no-such-flag"
    ]
    assert _cpr_problems(["cpr", "no-such-command"]) == ["cpr has no command 'no-such-command'"]
    assert _job_problems(["python", "jobs/build_dataset.py", "--stagez", "x"]) == [
        "jobs/build_dataset.py has no --stagez"
    ]


# --- the steps in order: each resource made before it is used --------------------------------

CREATED = re.compile(r"`((?:namespace|secret|serviceaccount|nodegroup|crd|image|configmap|role|"
                     r"bucket|quota|endpoint)/[\w.:-]+)`")  # fmt: skip
APPLIED = re.compile(r"`(infra/[\w/.-]+\.yaml)`")
PLURAL = {"RayJob": "rayjobs", "RayService": "rayservices", "RayCronJob": "raycronjobs"}


def _documents(path: Path) -> list[dict]:
    """The Kubernetes objects of a manifest file, those a ConfigMap holds as `*.yaml` too."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d and "kind" in d]
    for doc in list(docs):
        if doc["kind"] == "ConfigMap":
            for key, text in doc.get("data", {}).items():
                inner = yaml.safe_load(text) if key.endswith(".yaml") else None
                if isinstance(inner, dict) and "kind" in inner:
                    docs.append(inner)
    return docs


def _walk(node, found: set[str]) -> None:
    if isinstance(node, dict):
        if "secretKeyRef" in node:
            found.add(f"secret/{node['secretKeyRef']['name']}")
        if node.get("secretName"):
            found.add(f"secret/{node['secretName']}")
        if node.get("serviceAccountName"):
            found.add(f"serviceaccount/{node['serviceAccountName']}")
        if "configMap" in node and isinstance(node["configMap"], dict):
            found.add(f"configmap/{node['configMap']['name']}")
        pool = (node.get("nodeSelector") or {}).get("cpr-ray/pool")
        if pool:
            found.add(f"nodegroup/{pool}")
        image = node.get("image")
        if isinstance(image, str) and (m := re.search(r"cpr-ray:COMMIT_SHA-(cpu|gpu)$", image)):
            found.add(f"image/{m.group(1)}")
        for value in node.values():
            _walk(value, found)
    elif isinstance(node, list):
        for value in node:
            _walk(value, found)


def needs_and_makes(doc: dict) -> tuple[set[str], set[str]]:
    """What applying `doc` needs to exist already, and what it makes."""
    needs: set[str] = set()
    namespace = doc["metadata"].get("namespace")
    if namespace:
        needs.add(f"namespace/{namespace}")
    if doc["kind"] in PLURAL:
        needs.add(f"crd/{PLURAL[doc['kind']]}.ray.io")
    _walk(doc.get("spec", {}), needs)
    name = doc["metadata"].get("name")
    makes = {f"{doc['kind'].lower()}/{name}"} if name else set()
    return needs, makes


def missing_before_use(rows: list[list[str]]) -> list[str]:
    """Each step's applied manifests' needs that no step up to it created."""
    created: set[str] = set()
    missing = []
    for row in rows:
        created |= set(CREATED.findall(row[-2]))
        docs = [d for path in APPLIED.findall(row[2]) for d in _documents(ROOT / path)]
        for doc in docs:
            created |= needs_and_makes(doc)[1]
        for doc in docs:
            for need in sorted(needs_and_makes(doc)[0] - created):
                missing.append(f"step {row[0]} ({row[1]}): {need}")
    return missing


def test_each_step_creates_what_the_manifests_it_applies_use():
    rows = _table_rows(_day_one())
    applied = {path for row in rows for path in APPLIED.findall(row[2])}
    # the fleet, a build and the refresh all come up through the walk-through's steps
    assert {"infra/judges/judges-rayservice.yaml", "infra/jobs/build-rayjob.yaml",
            "infra/k8s/30-refresh-cronjob.yaml"} <= applied  # fmt: skip
    assert missing_before_use(rows) == []
    # the node groups the walk-through says it creates are the eksctl config's
    from cpr_ray.capacity import node_groups

    said = {c for row in rows for c in CREATED.findall(row[-2]) if c.startswith("nodegroup/")}
    assert said == {f"nodegroup/{g.labels['cpr-ray/pool']}" for g in node_groups()}


def test_the_order_check_can_fail():
    """The operator's finding: the fleet started before the namespace and its Secret."""
    rows = _table_rows(_day_one())
    (fleet,) = [r for r in rows if "judges-rayservice.yaml" in r[2]]
    early = [fleet] + [r for r in rows if r is not fleet]
    missing = missing_before_use(early)
    assert any("namespace/cpr-ray" in m for m in missing)
    assert any("secret/cpr-judges-secrets" in m for m in missing)


def _yaml_block(name: str) -> str:
    text = (ROOT / "infra" / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if b.startswith(name)]
    return block


def test_the_refresh_judges_on_an_endpoint_that_is_up_at_night(tmp_path):
    """refresh.yaml as the walk-through shows it loads, and its judges are an endpoint the
    walk-through keeps up between builds: the hosted provider, or the fleet only if the
    walk-through never deletes it."""
    from urllib.parse import urlsplit

    from cpr_ray.config import load_config

    config = tmp_path / "refresh.yaml"
    config.write_text(_yaml_block("# refresh.yaml"))
    endpoint = load_config(file=config, env={}).llm.base_url
    hosted = load_config("cluster-hosted", env={}).llm.base_url
    ingress = yaml.safe_load((ROOT / "infra" / "judges" / "judges-ingress.yaml").read_text())
    fleet_host = ingress["spec"]["rules"][0]["host"]
    readme = (ROOT / "infra" / "README.md").read_text()
    if urlsplit(endpoint).hostname == fleet_host:
        assert "delete rayservice cpr-judges" not in readme
    else:
        assert endpoint == hosted
    # the day-one table's refresh step names the file the night runs
    (row,) = [r for r in _table_rows(_day_one()) if r[1] == "The nightly refresh"]
    assert "refresh.yaml" in row[2]
