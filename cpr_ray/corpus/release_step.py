"""A release step's diff files fetched, parsed and applied in Ray tasks: no diff row reaches the
driver, and no task reads or writes another key bucket's part of a corpus table.

**Fetch and parse** (`stage`). One task per diff file downloads it into the step's folder (a
file there is complete or absent, and a rerun keeps it), parses it a batch at a time with
ingest's parser, and writes the rows into the key buckets of a staging table — bucket k of the
corpus table each record lands in: corpus id for papers and abstracts, citing id for citations —
with its rejects beside. It hands back counts per bucket (`Staged`).

**Apply** (`apply_papers`, `apply_citations`). One task per touched bucket (`touched_buckets`)
reads its share of the staged records, finds the rows they change in its own fragments, rebuilds
them as ingest built them (`updates`), and returns its edit as fragment metadata
(`bucket_edits`); the driver commits a table's edits as one version. The citations of a deleted
paper are found in its own bucket when it cites (bucketed by citing id), but the citations *to*
it may sit in any bucket: a step that deletes papers has every citations bucket look for them in
its `cited_id` column.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray import buckets, duck
from cpr_ray.buckets import (
    BUCKET,
    BucketPlan,
    bucketed_dataset,
    read_parquet_bucket,
    run_buckets,
    write_partitions,
)
from cpr_ray.config import Config
from cpr_ray.corpus import bucket_edits, linking, updates
from cpr_ray.corpus.parsing import ParseRecords, parsed_batches
from cpr_ray.corpus.s2_api import FileFetcher
from cpr_ray.corpus.s2orc import recover_contexts
from cpr_ray.corpus.shards import ReadShards
from cpr_ray.storage import Storage

T = TypeVar("T")
CITATION_KEY = ["citing_id", "cited_id"]
PARSED_DROP = ("reject_reason", "raw", "path")


@dataclass(frozen=True)
class Staged:
    """One side (update or delete records) of one dataset's step, parsed into key buckets: where
    its rows are and how many, never the rows."""

    uri: str
    rows_by_bucket: dict[int, int] = field(default_factory=dict)
    rejected: int = 0
    skipped: int = 0
    fetched_bytes: int = 0

    @property
    def kept(self) -> int:
        return sum(self.rows_by_bucket.values())


@dataclass(frozen=True)
class Side:
    """Files to stage into one staging table: one side of one dataset's step (or new OpenAlex
    partitions, already in storage: no `urls`)."""

    files: tuple[str, ...]
    step: ParseRecords
    out: str
    rejects: str  # prefix of its rejects files
    urls: tuple[str, ...] = ()
    part: str = "diff"  # names the written files; a retried task rewrites its own


@dataclass(frozen=True)
class FetchParse:
    """Task i: file i of all sides downloaded (unless a rerun finds it) and parsed batch by batch
    into the key buckets of its side's table (memory: one batch), rejected lines beside."""

    sides: tuple[Side, ...]
    fetch: FileFetcher | None
    reader: ReadShards
    batch_lines: int

    @property
    def tasks(self) -> list[tuple[int, int]]:
        return [(s, i) for s, side in enumerate(self.sides) for i in range(len(side.files))]

    def __call__(self, t: int) -> tuple[int, Staged]:
        s, i = self.tasks[t]
        side, storage = self.sides[s], self.reader.storage
        fetched = 0
        if side.urls and not storage.is_file(side.files[i]):
            assert self.fetch is not None
            with storage.atomic_output(side.files[i]) as sink:
                fetched = self.fetch.download(side.urls[i], sink)
        by_bucket: dict[int, int] = {}
        rejected = skipped = 0
        for j, rows in enumerate(
            parsed_batches(self.reader, side.files[i], side.step, self.batch_lines)
        ):
            bucket = rows[BUCKET]
            kept = rows.filter(pc.greater_equal(bucket, 0))
            bad = rows.filter(pc.equal(bucket, buckets.REJECTED))
            skipped += int(pc.sum(pc.equal(bucket, buckets.SKIPPED)).as_py() or 0)
            rejected += bad.num_rows
            for item in pc.value_counts(kept[BUCKET]).to_pylist():
                by_bucket[item["values"]] = by_bucket.get(item["values"], 0) + item["counts"]
            part = f"{side.part}-{i:05d}-{j:04d}"
            if kept.num_rows:
                write_partitions(kept.drop_columns(list(PARSED_DROP)), side.out, storage, part)
            if bad.num_rows:
                storage.write_parquet(
                    bad.select(["path", "reject_reason", "raw"]), f"{side.rejects}-{part}.parquet"
                )
        return s, Staged(side.out, by_bucket, rejected, skipped, fetched)


def stage(
    cfg: Config, storage: Storage, sides: Sequence[Side], fetch: FileFetcher | None = None
) -> list[Staged]:
    """Every file of every side (fetched first from its URL, when it has one) parsed into the
    buckets of its side's table, one task each, all at once; the counts of each side."""
    task = FetchParse(tuple(sides), fetch, ReadShards(storage, "fail"), cfg.ingest.batch_size)
    done = run_buckets(len(task.tasks), task, cfg.ingest.cpus_per_task, _memory(cfg))
    return [merge_staged(side.out, [r for s, r in done if s == n]) for n, side in enumerate(sides)]


def merge_staged(uri: str, parts: Sequence[Staged]) -> Staged:
    by_bucket: dict[int, int] = {}
    for s in parts:
        for k, n in s.rows_by_bucket.items():
            by_bucket[k] = by_bucket.get(k, 0) + n
    return Staged(
        uri,
        by_bucket,
        sum(s.rejected for s in parts),
        sum(s.skipped for s in parts),
        sum(s.fetched_bytes for s in parts),
    )


def touched_buckets(
    num_buckets: int, staged: Sequence[Staged], ids: Sequence[int] = (), every: bool = False
) -> list[int]:
    """The buckets a step edits: those its staged records fall in and those of `ids` (papers
    relinked to a new OpenAlex work); all of them when `every` (citations to deleted papers)."""
    if every:
        return list(range(num_buckets))
    found = {k for s in staged for k, n in s.rows_by_bucket.items() if n}
    return sorted(found | {int(i) % num_buckets for i in ids})


def _memory(cfg: Config) -> int:
    return cfg.refresh.task_memory_mb << 20


def _on(i: int, *, chosen: Sequence[int], fn: Callable[[int], T]) -> T:
    return fn(chosen[i])


def _edit_buckets(
    cfg: Config,
    storage: Storage,
    p: BucketPlan,
    chosen: Sequence[int],
    edit: Callable[..., bucket_edits.BucketEdit],
) -> tuple[buckets.BucketLayout, dict[str, int]]:
    """`edit(k, p=, storage=, fragment_rows=)` for each chosen bucket k, one task each, then
    one commit of every bucket's edit: the new layout and the rows changed."""
    fn = partial(edit, p=p, storage=storage, fragment_rows=cfg.ingest.lance_fragment_rows)
    task = partial(_on, chosen=list(chosen), fn=fn)
    edits = run_buckets(len(chosen), task, cfg.ingest.cpus_per_task, _memory(cfg))
    return bucket_edits.commit(p, storage, edits), bucket_edits.total(edits)


def _read(storage: Storage, staged: Staged | None, k: int, schema: pa.Schema) -> pa.Table:
    if staged is None or not staged.rows_by_bucket.get(k):
        return schema.empty_table()
    return read_parquet_bucket(storage, staged.uri, k, schema)


def _ids(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    flat = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return flat.cast(pa.int64())


# -- papers ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PaperSides:
    """A step's staged paper and abstract records (absent: the step has none)."""

    papers: Staged | None = None
    abstracts: Staged | None = None
    gone_papers: Staged | None = None
    gone_abstracts: Staged | None = None

    def all(self) -> list[Staged]:
        return [
            s for s in (self.papers, self.abstracts, self.gone_papers, self.gone_abstracts) if s
        ]


def _papers_bucket(
    k: int,
    *,
    p: BucketPlan,
    storage: Storage,
    sides: PaperSides,
    schemas: dict[str, pa.Schema],
    relink: pa.Array,
    keys_uri: str,
    key_buckets: int,
    fragment_rows: int,
) -> bucket_edits.BucketEdit:
    """Bucket k of the papers table: its papers the step updates, re-abstracts, relinks or
    deletes, rebuilt from their records and current rows."""
    papers = _read(storage, sides.papers, k, schemas["papers"])
    abstracts = _read(storage, sides.abstracts, k, schemas["abstracts"])
    forget = _ids(_read(storage, sides.gone_abstracts, k, schemas["abstracts"])["corpus_id"])
    gone = _ids(_read(storage, sides.gone_papers, k, schemas["papers"])["corpus_id"])
    n = p.layout.num_buckets
    relink = pa.array([i for i in relink.to_pylist() if i % n == k], pa.int64())
    ids = pa.concat_arrays(
        [_ids(papers["corpus_id"]), _ids(abstracts["corpus_id"]), relink, forget]
    )
    ids = ids.unique()
    wanted = pa.concat_arrays([ids, gone]).unique()
    names = storage.open_lance(p.uri, p.version).schema.names
    found = bucket_edits.current_rows(p, storage, k, pc.field("corpus_id").isin(wanted), names)
    current = found.filter(pc.is_in(found["corpus_id"], ids)).select(names)
    current = updates.forget_abstracts(current, forget)
    touched = pa.concat_arrays([relink, forget])
    paper_rec, abstract_rec = updates.rebuild_inputs(papers, abstracts, current, touched)
    works = _key_rows(storage, keys_uri, linking.s2_keys(paper_rec, key_buckets), schemas["works"])
    rows = updates.rebuilt_papers(paper_rec, abstract_rec, works, key_buckets)
    rows = rows.filter(pc.invert(pc.is_in(rows["corpus_id"], gone)))
    return bucket_edits.edit_bucket(
        p,
        storage,
        k,
        found,
        rows,
        pa.table({"corpus_id": gone}),
        on=["corpus_id"],
        fragment_rows=fragment_rows,
    )


def _key_rows(storage: Storage, keys_uri: str, keys: pa.Table, schema: pa.Schema) -> pa.Table:
    """OpenAlex key rows (payload included) for S2 key rows (`linking.s2_keys`): the key table
    read in the key buckets those keys hash to only."""
    if not keys.num_rows:
        return schema.empty_table()
    found = bucketed_dataset(storage, keys_uri).to_table(
        columns=schema.names,
        filter=pc.field(BUCKET).isin(keys[BUCKET].unique())
        & pc.field("key").isin(keys["key"].unique()),
    )
    return found.cast(schema)


def apply_papers(
    cfg: Config,
    storage: Storage,
    p: BucketPlan,
    sides: PaperSides,
    schemas: dict[str, pa.Schema],
    *,
    relink: pa.Array,
    keys_uri: str,
    key_buckets: int,
) -> tuple[buckets.BucketLayout, dict[str, int]]:
    """The papers table with a step's paper and abstract records applied (and `relink`'s papers
    linked again): one task per touched bucket, one commit. Returns the new layout and counts."""
    chosen = touched_buckets(p.layout.num_buckets, sides.all(), relink.to_pylist())
    return _edit_buckets(
        cfg,
        storage,
        p,
        chosen,
        partial(
            _papers_bucket,
            sides=sides,
            schemas=schemas,
            relink=relink,
            keys_uri=keys_uri,
            key_buckets=key_buckets,
        ),
    )


# -- citations -------------------------------------------------------------------------------------


def _citations_bucket(
    k: int,
    *,
    p: BucketPlan,
    storage: Storage,
    citations: Staged | None,
    gone_citations: Staged | None,
    schemas: dict[str, pa.Schema],
    gone_papers: pa.Array,
    fragment_rows: int,
) -> bucket_edits.BucketEdit:
    """Bucket k of the citations table: the step's citation records upserted (keeping a citing
    sentence S2ORC recovered), deleted citations and those from or to deleted papers removed."""
    records = _read(storage, citations, k, schemas["citations"])
    gone = _read(storage, gone_citations, k, schemas["citations"]).select(CITATION_KEY)
    gone = gone.cast(pa.schema([(c, pa.int64()) for c in CITATION_KEY]))
    n = p.layout.num_buckets
    own_gone = pa.array([i for i in gone_papers.to_pylist() if i % n == k], pa.int64())
    citing = pa.concat_arrays([_ids(records["citing_id"]), gone["citing_id"].combine_chunks()])
    where = pc.field("citing_id").isin(pa.concat_arrays([citing, own_gone]).unique())
    if len(gone_papers):
        where = where | pc.field("cited_id").isin(gone_papers)
    names = storage.open_lance(p.uri, p.version).schema.names
    found = bucket_edits.current_rows(p, storage, k, where, names)
    recovered = recover_contexts(schemas["s2orc"].empty_table())
    rows = updates.changed_citations(records, found.select(names), recovered)
    if len(gone_papers):
        dead = pc.or_(
            pc.is_in(found["citing_id"], gone_papers), pc.is_in(found["cited_id"], gone_papers)
        )
        gone = pa.concat_tables([gone, found.filter(dead).select(CITATION_KEY).cast(gone.schema)])
        alive = pc.invert(
            pc.or_(
                pc.is_in(rows["citing_id"], gone_papers), pc.is_in(rows["cited_id"], gone_papers)
            )
        )
        rows = rows.filter(alive)
    if gone.num_rows and rows.num_rows:
        rows = duck.query(
            "SELECT * FROM rows ANTI JOIN gone USING (citing_id, cited_id)", rows=rows, gone=gone
        ).cast(rows.schema)
    return bucket_edits.edit_bucket(
        p, storage, k, found, rows, gone, on=CITATION_KEY, fragment_rows=fragment_rows
    )


def apply_citations(
    cfg: Config,
    storage: Storage,
    p: BucketPlan,
    citations: Staged | None,
    gone_citations: Staged | None,
    schemas: dict[str, pa.Schema],
    gone_papers: pa.Array,
) -> tuple[buckets.BucketLayout, dict[str, int]]:
    """The citations table with a step's citation records and deletes applied: one task per
    touched bucket (every bucket when papers were deleted), one commit."""
    staged = [s for s in (citations, gone_citations) if s]
    chosen = touched_buckets(p.layout.num_buckets, staged, every=len(gone_papers) > 0)
    return _edit_buckets(
        cfg,
        storage,
        p,
        chosen,
        partial(
            _citations_bucket,
            citations=citations,
            gone_citations=gone_citations,
            schemas=schemas,
            gone_papers=gone_papers,
        ),
    )
