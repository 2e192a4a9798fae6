"""The `ray:` section: which Ray cluster a command runs on, or how to start a local one."""

from __future__ import annotations

from pydantic import Field

from cpr_ray.sections import Count
from cpr_ray.sections import Section as _Section


class RayConfig(_Section):
    address: str | None = Field(
        None,
        description="Ray cluster address; unset starts (or joins via RAY_ADDRESS) a local one.",
    )
    num_cpus: Count | None = Field(None, description="CPUs for a local Ray; unset: all.")
    object_store_memory_mb: int | None = Field(
        None, ge=64, description="Object store size for a local Ray, in MiB."
    )
    temp_dir: str | None = Field(None, description="Ray's session directory for a local Ray.")
