"""The `tracking:` section: where `cpr train` and `cpr eval` log their runs in MLflow."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from cpr_ray.sections import Section as _Section


class TrackingConfig(_Section):
    """MLflow tracking (`cpr_ray.runs.tracking`): it records a run, it never changes what one
    computes, so every field is operational."""

    operational: ClassVar[frozenset[str]] = frozenset({"enabled", "uri", "experiment"})

    enabled: bool = Field(True, description="false: log nothing to MLflow.")
    uri: str | None = Field(
        None,
        description="MLflow tracking URI (a server's http(s)://…, or sqlite:///PATH); unset: "
        "MLFLOW_TRACKING_URI, else sqlite:///…/mlruns.db beside the outputs (train.out, eval.out) "
        "when they are local paths.",
    )
    experiment: str = Field("cpr-ray", description="The MLflow experiment runs are logged under.")
