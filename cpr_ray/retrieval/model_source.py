"""The loader: where a model named in a setting is read from, checked before anything loads
it, and every read of its files (transformers' ``from_pretrained``, its config, a JSON file of a
sentence-transformers checkpoint) with the loading settings of an
:class:`~cpr_ray.retrieval.spec.EncoderSpec` (``EncoderSpec.loading``). A new loading setting is a
field of the config's ``encoder:`` section and of the spec, read here: nothing else.

Every model this package loads (an encoder for evaluation, pooling, search or training, and the
config a memory plan reads) goes through :func:`locate_model` first, on the driver before an
actor pool or a training run starts and again where the weights load. A wrong name is then one
line that names the setting it came from and how it was read, where transformers would print a
few hundred lines from its hub code after retrying an unreachable hub for half a minute:

- a name that exists on disk, or cannot be a hub repository id (``/models/x``, ``./x``,
  ``a/b/c``), is read as a folder, which must hold a ``config.json``;
- anything else is read as a hub name: found in the local hub cache, or (unless
  ``HF_HUB_OFFLINE`` is set) asked of the hub once, without retries, so an unreachable hub
  answers in a second.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from huggingface_hub.errors import StrictDataclassError

from cpr_ray.errors import ConfigError, UserError
from cpr_ray.retrieval.spec import EncoderSpec

HUB_TIMEOUT_S = 10.0
# what transformers raises for a model found but not loadable: files missing from the folder or
# repository (OSError), a config.json field of the wrong type (its strict config dataclasses)
LOAD_ERRORS = (OSError, StrictDataclassError)


class ModelError(UserError, ValueError):
    """A model that cannot be loaded, or not encoded the way its own config says."""


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (transformers' span several)."""
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return text or type(exc).__name__


def unloadable(model: str, setting: str, exc: BaseException) -> ModelError:
    """The one line for a model `locate_model` found that transformers cannot load."""
    return ModelError(f"{setting}: model {model} cannot be loaded ({one_line(exc)})")


def locate_model(model: str, setting: str, revision: str | None = None) -> Literal["folder", "hub"]:
    """How `model` (the value of `setting`, e.g. ``encoder.model``) will be read (a hub name at
    `revision`, where one is pinned); ModelError naming `setting` when it cannot be."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if not model or not model.strip():
        raise ModelError(f"{setting} is empty: name a model folder or a hub model")
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelError(f"{setting}: {model} (read as a folder) is a file, not a model folder")
        if not (path / "config.json").is_file():
            raise ModelError(
                f"{setting}: {model} (read as a folder) holds no config.json: not a model folder"
            )
        return "folder"
    try:
        validate_repo_id(model)
    except HFValidationError:
        raise ModelError(f"{setting}: {model} (read as a folder): no such folder") from None
    _require_hub_model(model, setting, revision)
    return "hub"


def _require_hub_model(model: str, setting: str, revision: str | None) -> None:
    from huggingface_hub import get_hf_file_metadata, hf_hub_url, try_to_load_from_cache
    from huggingface_hub.constants import is_offline_mode
    from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError

    if isinstance(try_to_load_from_cache(model, "config.json", revision=revision), str):
        return
    at = f" at revision {revision}" if revision else ""
    where = f"{setting}: {model!r}{at} is no folder here, and read as a hub name"
    if is_offline_mode():
        raise ModelError(
            f"{where} it is not in the local hub cache, and HF_HUB_OFFLINE is set: give a model "
            "folder, or fetch the model where the hub can be reached"
        )
    try:  # one request, no retries (a download would retry an unreachable hub for ~25 s)
        url = hf_hub_url(model, "config.json", revision=revision)
        get_hf_file_metadata(url, timeout=HUB_TIMEOUT_S)
    except RepositoryNotFoundError:
        raise ModelError(
            f"{where} the hub has no such model (or it is private or gated: set HF_TOKEN)"
        ) from None
    except EntryNotFoundError:
        raise ModelError(f"{where} its hub repository has no config.json") from None
    except Exception as exc:  # the hub client's network errors have no common base of its own
        raise ModelError(
            f"{where} the hub cannot be reached ({one_line(exc)}): give a model folder, or set "
            "HF_HUB_OFFLINE=1 to load from the local hub cache"
        ) from None


def model_label(model: str | None) -> str | None:
    """A short name for a model path or hub name: its last part, or last two when generic."""
    if not model:
        return None
    parts = [p for p in str(model).rstrip("/").split("/") if p]
    if len(parts) > 1 and (parts[-1] in ("model", "models") or parts[-1].startswith("checkpoint")):
        return f"{parts[-2]}-{parts[-1]}"
    return parts[-1] if parts else None


# -- loading: every read of a model's files, with its spec's loading settings ------------------

REMOTE_CODE_KEY = "encoder.trust_remote_code"


class RemoteCodeError(ModelError, ConfigError):
    """A model whose own code may not run (trust_remote_code off): a setting to change."""


def refuses_remote_code(exc: BaseException) -> bool:
    """Whether `exc` is transformers refusing to run a model's own code (trust_remote_code
    off): its ValueError asks for that argument."""
    return isinstance(exc, ValueError) and "trust_remote_code" in str(exc)


def remote_code_message(model: str) -> str:
    """One line naming the setting that lets `model`'s own code run."""
    return (
        f"model {model} ships its own modelling code (auto_map in its config), which runs only "
        f"with {REMOTE_CODE_KEY}=true (a pooler's: trust_remote_code in its encoder); set it "
        "only for a model whose code you trust"
    )


def locate(spec: EncoderSpec) -> Literal["folder", "hub"]:
    """`locate_model` of the spec's model, named by the setting the spec came from."""
    return locate_model(spec.model, spec.setting, spec.revision)


@contextmanager
def loading_errors(spec: EncoderSpec, name: str | None = None) -> Iterator[None]:
    """transformers' errors while the spec's model loads as one line: the setting that lets a
    model's own code run, or the model that cannot be loaded."""
    try:
        yield
    except ModelError:
        raise
    except ValueError as exc:
        if not spec.trust_remote_code and refuses_remote_code(exc):
            raise RemoteCodeError(remote_code_message(name or spec.model)) from None
        raise
    except LOAD_ERRORS as exc:
        raise unloadable(spec.model, spec.setting, exc) from None


def model_json(spec: EncoderSpec, filename: str) -> Any | None:
    """A JSON file of the spec's model (a local folder or hub repository); None when it has no
    such file."""
    folder = Path(spec.model)
    if folder.is_dir():
        path = folder / filename
        return json.loads(path.read_text()) if path.is_file() else None
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    try:
        fetched = hf_hub_download(spec.model, filename, revision=spec.revision)
        return json.loads(Path(fetched).read_text())
    except LocalEntryNotFoundError:  # offline and never fetched: unknown, not absent
        raise
    except EntryNotFoundError:
        return None


def model_config(spec: EncoderSpec) -> Any:
    """The model's transformers config (its config.json only): read before a training run's
    workers start, and by the memory plan. A model whose config is its own code loads it only
    with the spec's trust_remote_code (which runs it)."""
    from transformers import AutoConfig

    model = spec.model
    if locate(spec) == "folder":
        model = str(Path(model).expanduser())
    try:
        with loading_errors(spec):
            return AutoConfig.from_pretrained(model, **spec.loading)
    except ModelError:
        raise
    except ValueError as exc:  # a config transformers cannot read
        raise unloadable(spec.model, spec.setting, exc) from None


def pretrained(spec: EncoderSpec, *, masked_lm: bool = False) -> tuple[Any, Any]:
    """(tokenizer, backbone) of the spec's model, weights in its dtype: AutoModel, or the
    masked-LM model (SPLADE's vocabulary head)."""
    from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer

    locate(spec)
    builder = AutoModelForMaskedLM if masked_lm else AutoModel
    with loading_errors(spec):
        tokenizer = AutoTokenizer.from_pretrained(spec.model, **spec.loading)
        return tokenizer, builder.from_pretrained(spec.model, dtype=spec.dtype, **spec.loading)


def meta_model(spec: EncoderSpec, config: Any, name: str) -> Any:
    """The model `pretrained` would load, built from `config` on the meta device: every
    parameter's shape, no storage. ValueError when transformers cannot build it."""
    import torch
    from transformers import AutoModel

    with loading_errors(spec, name), torch.device("meta"):
        return AutoModel.from_config(config, trust_remote_code=spec.trust_remote_code)
