"""Where a build's storage is and how it is reached: the `storage:` settings, apart from the
client (`storage.Storage`) so that the settings tree and the tools that only pass them along
need none of the client's dependencies."""

from __future__ import annotations

from pydantic import Field

from cpr_ray.sections import Section


class BucketSettings(Section):
    """How one bucket is reached: its region, and whether requests go unsigned."""

    s3_region: str | None = Field(None, description="The bucket's region; unset: AWS's chain.")
    s3_anonymous: bool = Field(
        False, description="Unsigned requests (a public bucket): no credentials, no IAM policy."
    )


class StorageConfig(Section):
    root: str | None = Field(
        None,
        description="URI every build stage writes under: a local path, file://… or s3://…. "
        "Required by the build; evaluation writes to eval.out instead.",
    )
    s3_endpoint: str | None = Field(
        None,
        description="Endpoint override for S3-compatible stores (MinIO, moto, Ceph), "
        "e.g. http://127.0.0.1:9000. Leave unset for AWS.",
    )
    s3_region: str | None = Field(None, description="S3 region; unset uses the AWS default chain.")
    s3_virtual_addressing: bool = Field(
        False,
        description="Use virtual-host style bucket addressing. S3-compatible stores usually "
        "need the default path style.",
    )
    s3_anonymous: bool = Field(False, description="Read public buckets without credentials.")
    max_retries: int = Field(
        4,
        ge=0,
        description="Retries of one S3 request that failed in a way worth retrying (503 SlowDown, "
        "500, a reset connection), with backoff, in every client (pyarrow, boto3, Lance), before "
        "the stage fails: at cluster scale S3 throttles a share of requests. pyarrow's backoff "
        "doubles, so a dead endpoint is reported after ~5 s at 4, ~30 s at 6.",
    )
    buckets: dict[str, BucketSettings] = Field(
        default_factory=dict,
        description="Settings of particular buckets, by name, over s3_region/s3_anonymous: e.g. "
        "{openalex: {s3_region: us-east-1, s3_anonymous: true}} reads the public OpenAlex "
        "snapshot unsigned from its region while the build root uses the team's region and role.",
    )

    def for_bucket(self, bucket: str) -> BucketSettings:
        return self.buckets.get(bucket) or BucketSettings(
            s3_region=self.s3_region, s3_anonymous=self.s3_anonymous
        )
