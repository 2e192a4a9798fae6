"""Building the tree from its sources: profile < YAML file < ``CPR_*`` env < ``--set`` < flags,
and the one-line error that names the key to fix."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

from cpr_ray.config.bundled import minilm_dir, profile_names, sample_dir
from cpr_ray.config.tree import Config
from cpr_ray.errors import ConfigError, StorageError
from cpr_ray.sections import Section as _Section
from cpr_ray.storage.store import Storage, StorageConfig

ENV_PREFIX = "CPR_"
ENV_NESTING = "__"


def _profile_dict(name: str) -> dict[str, Any]:
    if name not in profile_names():
        raise ConfigError(f"unknown profile {name!r}; known profiles: {', '.join(profile_names())}")
    text = (resources.files("cpr_ray") / "profiles" / f"{name}.yaml").read_text()
    data = yaml.safe_load(text) or {}
    base = data.pop("extends", None)  # a recipe is the cluster profile plus its own settings
    if base is not None:
        data = _merge(_profile_dict(str(base)), data)
    data["profile"] = name
    return data


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = [p for p in dotted.split(".") if p]
    if not parts:
        raise ConfigError(f"empty config key in override {dotted!r}")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{dotted}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = value


def _parse_scalar(text: str) -> Any:
    """`--set ingest.num_buckets=16` should give an int, `--set llm.base_url=null` a None."""
    return yaml.safe_load(text) if text.strip() else ""


def _env_overrides(env: Mapping[str, str]) -> list[tuple[str, Any]]:
    out = []
    for name, value in sorted(env.items()):
        if name.startswith(ENV_PREFIX) and ENV_NESTING in name:
            dotted = name[len(ENV_PREFIX) :].lower().replace(ENV_NESTING, ".")
            out.append((dotted, _parse_scalar(value)))
    return out


def _expand(value: Any) -> Any:
    """`{sample}` in a path means the bundled sample, `{minilm}` the MiniLM package's model,
    wherever they are installed."""
    if isinstance(value, str):
        value = value.replace("{sample}", str(sample_dir()))
        return value.replace("{minilm}", str(minilm_dir())) if "{minilm}" in value else value
    if isinstance(value, dict):
        return {k: _expand(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v) for v in value]
    return value


def format_validation_error(err: ValidationError) -> str:
    lines = []
    for item in err.errors():
        # a None-able section reports its branch ("function-after[…]") in the path: drop it
        key = ".".join(str(p) for p in item["loc"] if not _is_branch(p)) or "(top level)"
        msg = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            msg = "unknown key"
            parent = item["loc"][:-1]
            allowed = _allowed_keys(parent)
            if allowed:
                msg += f"; allowed here: {', '.join(allowed)}"
        elif item["type"] == "missing":
            msg = "required but not set"
        lines.append(f"{key}: {msg}")
    return "invalid config: " + "; ".join(lines)  # one line, as every user error is


def _is_branch(part: Any) -> bool:
    return isinstance(part, str) and ("[" in part or part in _MODEL_NAMES)


_MODEL_NAMES = {c.__name__ for c in _Section.__subclasses__()}


def _allowed_keys(loc: Sequence[Any]) -> list[str]:
    model: type[BaseModel] = Config
    for part in loc:
        if _is_branch(part):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return []
        section = next(
            (a for a in (field.annotation, *get_args(field.annotation)) if _is_section(a)), None
        )
        if section is None:
            return []
        model = section
    return sorted(model.model_fields)


def _is_section(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _config_text(
    name: str, profile: str | None, env: Mapping[str, str], overrides: Sequence[str]
) -> str:
    """A config file's text: a local path, or an object-store URI (a cluster job's config
    lives beside its data), reached with the storage settings of the profile, the CPR_STORAGE__*
    variables and `--set storage.*` — the file cannot say how to reach itself."""
    if not name.startswith("s3://"):
        path = Path(name)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        return path.read_text()

    data = _profile_dict(profile) if profile else {}
    for dotted, value in _env_overrides(env):
        if dotted.startswith("storage."):
            _set_path(data, dotted, value)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if sep and key.strip().startswith("storage."):
            _set_path(data, key.strip(), _parse_scalar(raw))
    try:
        storage = Storage(StorageConfig.model_validate(data.get("storage") or {}))
        if not storage.is_file(name):
            raise ConfigError(f"config file not found: {name}")
        return storage.read_text(name)
    except (StorageError, ValidationError) as exc:
        raise ConfigError(f"cannot read config {name}: {exc}") from None


def load_config(
    profile: str | None = None,
    file: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
    *,
    unpin_for_endpoint: bool = False,
) -> Config:
    """Build the config: profile < YAML file (which may name its own `profile`) < env < --set <
    flags. `flags` maps dotted keys to typed values (a command's own options, e.g. `--top-k` for
    `eval.top_k`); None means the flag was not given.

    `unpin_for_endpoint` (the dry run only): when the result names an LLM endpoint, a real judge
    decides, so the profile's placeholder pins are dropped before validation; everywhere else
    pins beside an endpoint are a config error."""
    env = os.environ if env is None else env
    data: dict[str, Any] = {}
    file_data: dict[str, Any] = {}
    if file is not None:
        name = os.fspath(file)
        text = _config_text(name, profile, env, overrides)
        try:
            file_data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {name} is not valid YAML: {exc}") from exc
        if not isinstance(file_data, dict):
            raise ConfigError(f"config file {name} must hold a mapping at the top level")
    base_profile = profile or file_data.get("profile")
    if base_profile is not None:
        data = _profile_dict(str(base_profile))
    data = _merge(data, file_data)
    for dotted, value in _env_overrides(env):
        _set_path(data, dotted, value)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"override {item!r} must look like key.path=value")
        _set_path(data, key.strip(), _parse_scalar(raw))
    for dotted, value in (flags or {}).items():
        if value is not None:
            _set_path(data, dotted, value)
    llm = data.get("llm")
    if unpin_for_endpoint and isinstance(llm, dict) and llm.get("base_url"):
        for options in (llm.get("stages") or {}).values():
            if isinstance(options, dict):
                options.pop("pin", None)
    try:
        return Config.model_validate(_expand(data))
    except ValidationError as err:
        raise ConfigError(format_validation_error(err)) from None
