"""The corpus tables as a refresh changes them: the Lance tables the ingest manifest points at
(papers, citations and, once built, the key table `paper_keys`), the versions and bucket layouts
it records, and the restore of a step a killed refresh left unpublished (the edits themselves:
`release_step`, `bucket_edits`)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from cpr_ray.corpus import paper_keys
from cpr_ray.corpus.ingest import KEPT_INPUTS
from cpr_ray.errors import StorageError
from cpr_ray.runs.stage_runner import Manifest
from cpr_ray.storage.store import Storage
from cpr_ray.tables import buckets

if TYPE_CHECKING:
    import lance


TABLES = ("papers", "citations", paper_keys.TABLE)


class Corpus:
    """The Lance tables the ingest manifest points at, with the versions it records."""

    def __init__(self, storage: Storage, manifest: Manifest) -> None:
        self.storage = storage
        self.manifest = manifest
        tables = manifest["tables"]
        missing = [t for t in KEPT_INPUTS.values() if t not in tables]
        if missing:
            raise StorageError(
                f"the corpus under {storage.root} was built by a version of ingest that kept "
                f"no {', '.join(missing)}: a refresh needs them; rebuild it once with "
                "cpr build --stages ingest --force"
            )
        self.uris = {name: tables[name]["uri"] for name in TABLES if name in tables}
        self.layouts = {
            name: buckets.BucketLayout.from_dict(tables[name]["layout"])
            for name in self.uris
            if "layout" in tables[name]
        }

    @property
    def names(self) -> list[str]:
        """The Lance tables this corpus has (a corpus ingested before the key table: two)."""
        return list(self.uris)

    def bucket_layout(self, name: str) -> buckets.BucketLayout:
        if name not in self.layouts:
            raise StorageError(
                f"the corpus under {self.storage.root} was ingested by a version that wrote no "
                f"bucket layout for {name}; rebuild it once with cpr build --stages ingest --force"
            )
        return self.layouts[name]

    def table(self, name: str) -> lance.LanceDataset:
        return self.storage.open_lance(self.uri(name))

    def uri(self, name: str) -> str:
        return self.uris[name]

    def commit(self, name: str, change: Callable[[lance.LanceDataset], object]) -> None:
        """`change` made to the table's latest version, committed once (`Storage.commit_lance`:
        made again when S3 broke off its answer, never twice)."""
        self.storage.commit_lance(self.uri(name), lambda: change(self.table(name)))

    def recorded_version(self, name: str) -> int | None:
        tables = self.manifest["tables"]
        return tables[name].get("version") if name in tables else None

    def restore_unfinished(self) -> list[str]:
        """Tables a killed refresh left past their recorded version, put back to it (a key
        table it built and never recorded is built again)."""
        restored = []
        for name in self.names:
            recorded = self.recorded_version(name)
            ds = self.table(name)
            if recorded is not None and ds.version != recorded:
                self.commit(name, partial(_restore, version=recorded))
                restored.append(f"{name} {ds.version} → {recorded}")
        return restored


def _restore(ds: lance.LanceDataset, version: int) -> None:
    """`ds` put back to `version`, committed as its next version (Lance's restore)."""
    ds.checkout_version(version).restore()
