"""Reads of the corpus tables at the version the ingest manifest pins.

A refresh commits new table versions while a build may be running; a stage that opened a table
at its latest version would then see another release than the one its inputs were mined from.
Every stage therefore takes a `PinnedTable` from the ingest manifest it checked at its start
(`stage.require_manifest`) and reads through it, so what it sees cannot move under it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.errors import StorageError
from cpr_ray.runs.stage_runner import Manifest, require_manifest
from cpr_ray.stages import INGEST
from cpr_ray.storage.store import Storage
from cpr_ray.tables import buckets

if TYPE_CHECKING:
    import lance


@dataclass(frozen=True)
class PinnedTable:
    """A Lance table of the corpus and the version a manifest records (None: an older manifest
    that recorded none, read at its latest)."""

    uri: str
    version: int | None = None

    @classmethod
    def of(cls, manifest: Manifest, name: str) -> PinnedTable:
        table = manifest["tables"][name]
        return cls(table["uri"], table.get("version"))

    def open(self, storage: Storage) -> lance.LanceDataset:
        return storage.open_lance(self.uri, self.version)

    def read(
        self, storage: Storage, columns: Sequence[str], ids: pa.Array | None = None
    ) -> pa.Table:
        """`columns` of the rows whose `corpus_id` is in `ids` (pushed down), or of every row."""
        where = None if ids is None else pc.field("corpus_id").isin(pc.unique(ids))
        return self.open(storage).to_table(columns=list(columns), filter=where)


def pinned_papers(storage: Storage) -> tuple[PinnedTable, str]:
    """Ingest's papers table at its published version, and ingest's run id (the stage input a
    refresh changes)."""
    manifest = require_manifest(storage, INGEST)
    return PinnedTable.of(manifest, "papers"), manifest["run_id"]


def bucket_plan(storage: Storage, ingest_manifest: Manifest, name: str) -> buckets.BucketPlan:
    """Which fragments of ingest's `name` table (at its pinned version) hold which key bucket:
    what a stage needs to read the table one bucket per task."""
    table = ingest_manifest["tables"][name]
    if "layout" not in table:
        raise StorageError(
            f"the corpus under {storage.root} was ingested by a version that wrote no bucket "
            f"layout for {name}: later stages read it by bucket; rebuild it once with "
            "cpr build --stages ingest --force"
        )
    layout = buckets.BucketLayout.from_dict(table["layout"])
    version = table.get("version")
    assert version is not None  # the ingest records a Lance table's version with its layout
    return buckets.plan(layout, storage, table["uri"], version)


def papers_by_id(
    storage: Storage, papers: PinnedTable, ids: pa.Array, columns: Sequence[str]
) -> pa.Table:
    """The named papers (a bounded id list, pushed down to Lance) at the pinned version."""
    return papers.read(storage, ["corpus_id", *(c for c in columns if c != "corpus_id")], ids)


def paper_texts(storage: Storage, papers: PinnedTable, ids: pa.Array) -> pa.Table:
    """Title, abstract, first topic and field of the given papers: what the judges read."""
    t = papers_by_id(storage, papers, ids, ["title", "abstract", "topics", "field"])
    names = [(ts[0]["name"] if ts else None) for ts in t["topics"].to_pylist()]
    return pa.table(
        {
            "corpus_id": t["corpus_id"],
            "title": t["title"],
            "abstract": t["abstract"],
            "top_topic": pa.array(names, pa.string()),
            "field": t["field"],
        }
    )
