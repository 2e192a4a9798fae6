"""The corpus tables as a refresh changes them: the Lance tables the ingest manifest points at,
the versions it records, and the upserts, deletes and change counts of a release step."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray import buckets
from cpr_ray.corpus.ingest import KEPT_INPUTS
from cpr_ray.errors import StorageError
from cpr_ray.storage import Storage

if TYPE_CHECKING:
    import lance

CITATION_KEY = ["citing_id", "cited_id"]
DELETE_CHUNK = 20_000  # ids per Lance delete predicate


class Corpus:
    """The Lance tables the ingest manifest points at, with the versions it records."""

    def __init__(self, storage: Storage, manifest: dict[str, Any]) -> None:
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
        self.papers_uri = tables["papers"]["uri"]
        self.citations_uri = tables["citations"]["uri"]
        self.layouts = {
            name: buckets.BucketLayout.from_dict(tables[name]["layout"])
            for name in ("papers", "citations")
            if "layout" in tables[name]
        }

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
        return self.papers_uri if name == "papers" else self.citations_uri

    def commit(self, name: str, change: Callable[[lance.LanceDataset], object]) -> None:
        """`change` made to the table's latest version, committed once (`Storage.commit_lance`:
        made again when S3 broke off its answer, never twice)."""
        self.storage.commit_lance(self.uri(name), lambda: change(self.table(name)))

    def recorded_version(self, name: str) -> int | None:
        return self.manifest["tables"][name].get("version")

    def restore_unfinished(self) -> list[str]:
        """Tables a killed refresh left past their recorded version, put back to it."""
        restored = []
        for name in ("papers", "citations"):
            recorded = self.recorded_version(name)
            ds = self.table(name)
            if recorded is not None and ds.version != recorded:
                self.commit(name, lambda t, v=recorded: t.checkout_version(v).restore())
                restored.append(f"{name} {ds.version} → {recorded}")
        return restored

    def rows_for(self, name: str, column: str, ids: pa.Array) -> pa.Table:
        if not len(ids):
            return self.table(name).schema.empty_table()
        return self.table(name).to_table(filter=pc.field(column).isin(ids))

    def upsert(self, name: str, rows: pa.Table) -> None:
        if rows.num_rows:
            on = "corpus_id" if name == "papers" else CITATION_KEY
            self.commit(
                name,
                lambda t: (
                    t.merge_insert(on)
                    .when_matched_update_all()
                    .when_not_matched_insert_all()
                    .execute(rows)
                ),
            )

    def delete_keys(self, name: str, keys: pa.Table) -> None:
        if keys.num_rows:
            on = "corpus_id" if name == "papers" else CITATION_KEY
            self.commit(name, lambda t: t.merge_insert(on).when_matched_delete().execute(keys))

    def delete_citations_of(self, ids: pa.Array) -> None:
        """Citations from or to deleted papers go with them."""
        values = ids.to_pylist()
        for start in range(0, len(values), DELETE_CHUNK):
            chunk = ", ".join(str(int(v)) for v in values[start : start + DELETE_CHUNK])
            where = f"citing_id IN ({chunk}) OR cited_id IN ({chunk})"
            self.commit("citations", lambda t, where=where: t.delete(where))

    def versions(self) -> dict[str, int]:
        return {name: self.table(name).version for name in ("papers", "citations")}

    def changes(self, begin: dict[str, int]) -> dict[str, dict[str, int]]:
        """Rows inserted, updated and deleted since `begin`, from Lance's change API."""
        out = {}
        for name in ("papers", "citations"):
            ds = self.table(name)
            if ds.version == begin[name]:
                out[name] = {"inserted": 0, "updated": 0, "deleted": 0}
                continue
            delta = ds.delta(begin_version=begin[name], end_version=ds.version)
            deleted = delta.get_deleted_row_ids()
            out[name] = {
                "inserted": delta.get_inserted_rows().read_all().num_rows,
                "updated": delta.get_updated_rows().read_all().num_rows,
                "deleted": sum(len(b) for b in deleted) if deleted is not None else 0,
            }
        return out
