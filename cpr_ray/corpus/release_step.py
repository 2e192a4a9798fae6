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

**Relink** (`relinked`). New OpenAlex partitions are parsed into the key table the same way,
their key column alone also staged in its key buckets (`Side.keys`), then made one file of
distinct keys per key bucket, a task each (`stage_new_keys`). A paper's identifiers may
hash to any key bucket, so then every papers bucket's task reads its own papers' DOI, MAG and
PubMed ids, keys them as ingest does and looks them up one key bucket of the new keys at a time:
a task holds its bucket's keys and one key bucket of the partition's, and neither the new keys
nor the papers table is read by the driver.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray

from cpr_ray.config import Config
from cpr_ray.corpus import bucket_edits, corpus_changes, linking, updates
from cpr_ray.corpus.parsing import ParseRecords, parsed_batches
from cpr_ray.corpus.s2_api import FileFetcher
from cpr_ray.corpus.s2orc import recover_contexts
from cpr_ray.corpus.shards import ReadShards
from cpr_ray.storage.store import Storage, join
from cpr_ray.tables import buckets
from cpr_ray.tables import duckdb_sql as duck
from cpr_ray.tables.buckets import (
    BUCKET,
    BucketPlan,
    bucketed_dataset,
    read_parquet_bucket,
    run_buckets,
    write_partitions,
)

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
    keys: str | None = None  # its `key` column alone, bucketed here too (`NewKeys`)


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
                if side.keys:
                    write_partitions(kept.select(["key", BUCKET]), side.keys, storage, part)
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


def touched_buckets(num_buckets: int, staged: Sequence[Staged], every: bool = False) -> list[int]:
    """The buckets a step edits: those its staged records fall in; all of them when `every`
    (citations to deleted papers, papers a new OpenAlex partition may relink)."""
    if every:
        return list(range(num_buckets))
    return sorted({k for s in staged for k, n in s.rows_by_bucket.items() if n})


def _memory(cfg: Config) -> int:
    return cfg.refresh.task_memory_mb << 20


def _on(i: int, *, chosen: Sequence[int], fn: Callable[[int], T]) -> T:
    return fn(chosen[i])


def task_groups(chosen: Sequence[int], weight: dict[int, int], tasks: int) -> list[list[int]]:
    """`chosen` buckets in at most `tasks` runs of consecutive ones, of about equal weight (a
    bucket weighs 1, its fixed cost, plus `weight`, its staged rows): a step touching thousands
    of buckets with little to do in each pays a few task starts, not thousands."""
    if not chosen:
        return []
    w = [1 + weight.get(k, 0) for k in chosen]
    target = sum(w) / max(1, min(tasks, len(chosen)))
    groups: list[list[int]] = [[]]
    held = 0.0
    for k, wk in zip(chosen, w):
        if groups[-1] and held + wk / 2 > target:
            groups.append([])
            held = 0.0
        groups[-1].append(k)
        held += wk
    return groups


@dataclass(frozen=True)
class EditedBuckets:
    """What one edit task hands back: its buckets' edits (fragment metadata and counts) and
    whether it wrote a file of the ids it changed (`corpus_changes`), never rows."""

    edits: tuple[bucket_edits.BucketEdit, ...]
    record_files: int


Edit = Callable[..., tuple[bucket_edits.BucketEdit, pa.Table]]


def _edit_group(
    i: int,
    *,
    groups: Sequence[Sequence[int]],
    fn: Callable[[int], tuple[bucket_edits.BucketEdit, pa.Table]],
    storage: Storage,
    record: str,
    name: str,
) -> EditedBuckets:
    edits, changed = [], [corpus_changes.RECORD.empty_table()]
    for k in groups[i]:
        edit, ids = fn(k)
        edits.append(edit)
        changed.append(ids)
    ids = pa.concat_tables(changed)
    if ids.num_rows:  # named for its first bucket: a retried task rewrites its own file
        storage.write_parquet(ids, join(record, f"{name}-{groups[i][0]:06d}.parquet"))
    return EditedBuckets(tuple(edits), int(ids.num_rows > 0))


def _edit_buckets(
    cfg: Config,
    storage: Storage,
    p: BucketPlan,
    chosen: Sequence[int],
    weight: dict[int, int],
    edit: Edit,
    record: str,
    name: str,
) -> tuple[buckets.BucketLayout, dict[str, int], int]:
    """`edit(k, p=, storage=, fragment_rows=)` for each chosen bucket k, a few buckets a task
    (`task_groups`: about two tasks a CPU of the cluster), each task writing the ids its
    buckets changed under `record`; then one commit of every bucket's edit: the new layout,
    the rows changed and the record files written."""
    fn = partial(edit, p=p, storage=storage, fragment_rows=cfg.ingest.lance_fragment_rows)
    cpus = float(ray.cluster_resources().get("CPU", 1))
    groups = task_groups(chosen, weight, max(1, int(2 * cpus / cfg.ingest.cpus_per_task)))
    task = partial(_edit_group, groups=groups, fn=fn, storage=storage, record=record, name=name)
    done = run_buckets(len(groups), task, cfg.ingest.cpus_per_task, _memory(cfg))
    edits = [e for d in done for e in d.edits]
    files = sum(d.record_files for d in done)
    return bucket_edits.commit(p, storage, edits), bucket_edits.total(edits), files


def _weight(staged: Sequence[Staged]) -> dict[int, int]:
    """Staged rows per bucket, over every side."""
    out: dict[int, int] = {}
    for s in staged:
        for k, n in s.rows_by_bucket.items():
            out[k] = out.get(k, 0) + n
    return out


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


@dataclass(frozen=True)
class NewKeys:
    """The keys new OpenAlex partitions added to the key table: their key column alone, staged
    in the key table's buckets (`Side.keys`), which each papers bucket looks its own papers'
    identifiers up in."""

    staged: Staged
    key_buckets: int


KEYS = pa.schema([("key", pa.string())])
PAPER_KEYS = ["corpus_id", "doi", "mag_id", "pmid"]


def _compact_keys(j: int, *, storage: Storage, parsed: Staged, out: str) -> Staged:
    keys = _read(storage, parsed, j, KEYS)["key"].unique()
    if not len(keys):
        return Staged(out)
    bucket = pa.array(np.full(len(keys), j, np.int32))
    write_partitions(pa.table({"key": keys, BUCKET: bucket}), out, storage, "keys")
    return Staged(out, {j: len(keys)})


def stage_new_keys(
    cfg: Config, storage: Storage, parsed: Staged, out: str, key_buckets: int
) -> NewKeys:
    """The keys a stage wrote beside its rows (`Side.keys`: a file per parsed batch in each key
    bucket) as one file of distinct keys per key bucket under `out`, one task per bucket: every
    papers bucket's task reads each key bucket's, so one file each, not one per batch."""
    chosen = sorted(k for k, n in parsed.rows_by_bucket.items() if n)
    fn = partial(_compact_keys, storage=storage, parsed=parsed, out=out)
    task = partial(_on, chosen=chosen, fn=fn)
    done = run_buckets(len(chosen), task, cfg.ingest.cpus_per_task, _memory(cfg))
    return NewKeys(merge_staged(out, done), key_buckets)


def relinked(p: BucketPlan, storage: Storage, k: int, new_keys: NewKeys | None) -> pa.Array:
    """Corpus ids of bucket k's papers with a DOI, MAG or PubMed id among `new_keys`: the
    bucket's own identifiers keyed as ingest keys them (`linking.s2_keys`) and looked up one key
    bucket at a time, so the task holds its bucket's keys and one key bucket of the new ones."""
    if new_keys is None or not new_keys.staged.kept:
        return pa.array([], pa.int64())
    has_key = " OR ".join(f"{c} IS NOT NULL" for c in PAPER_KEYS[1:])
    own = buckets.read_lance_bucket(p, storage, k, PAPER_KEYS, has_key)
    own = linking.s2_keys(own, new_keys.key_buckets).sort_by(BUCKET)
    bounds = np.searchsorted(own[BUCKET].to_numpy(), np.arange(new_keys.key_buckets + 1))
    found = [pa.array([], pa.int64())]
    for j in sorted(new_keys.staged.rows_by_bucket):
        mine = own.slice(bounds[j], bounds[j + 1] - bounds[j])
        if mine.num_rows:
            new = _read(storage, new_keys.staged, j, KEYS)["key"]
            found.append(_ids(mine.filter(pc.is_in(mine["key"], value_set=new))["corpus_id"]))
    return pa.concat_arrays(found).unique()


def _papers_bucket(
    k: int,
    *,
    p: BucketPlan,
    storage: Storage,
    sides: PaperSides,
    schemas: dict[str, pa.Schema],
    new_keys: NewKeys | None,
    keys_uri: str,
    key_buckets: int,
    fragment_rows: int,
) -> tuple[bucket_edits.BucketEdit, pa.Table]:
    """Bucket k of the papers table: its papers the step updates, re-abstracts, relinks or
    deletes, rebuilt from their records and current rows; and the ids it changed."""
    papers = _read(storage, sides.papers, k, schemas["papers"])
    abstracts = _read(storage, sides.abstracts, k, schemas["abstracts"])
    forget = _ids(_read(storage, sides.gone_abstracts, k, schemas["abstracts"])["corpus_id"])
    gone = _ids(_read(storage, sides.gone_papers, k, schemas["papers"])["corpus_id"])
    relink = relinked(p, storage, k, new_keys)
    ids = pa.concat_arrays(
        [_ids(papers["corpus_id"]), _ids(abstracts["corpus_id"]), relink, forget]
    )
    ids = ids.unique()
    wanted = pa.concat_arrays([ids, gone]).unique()
    if not len(wanted):  # a bucket the relink visits and finds nothing in: no read, no write
        edit = bucket_edits.BucketEdit(k, counts={"inserted": 0, "updated": 0, "deleted": 0})
        return edit, corpus_changes.RECORD.empty_table()
    names = storage.open_lance(p.uri, p.version).schema.names
    found = bucket_edits.current_rows(p, storage, k, pc.field("corpus_id").isin(wanted), names)
    current = found.filter(pc.is_in(found["corpus_id"], ids)).select(names)
    current = updates.forget_abstracts(current, forget)
    touched = pa.concat_arrays([relink, forget])
    paper_rec, abstract_rec = updates.rebuild_inputs(papers, abstracts, current, touched)
    works = _key_rows(storage, keys_uri, linking.s2_keys(paper_rec, key_buckets), schemas["works"])
    rows = updates.rebuilt_papers(paper_rec, abstract_rec, works, key_buckets)
    rows = rows.filter(pc.invert(pc.is_in(rows["corpus_id"], gone)))
    gone_rows = pa.table({"corpus_id": gone})
    edit = bucket_edits.edit_bucket(
        p, storage, k, found, rows, gone_rows, on=["corpus_id"], fragment_rows=fragment_rows
    )
    written, deleted = bucket_edits.changed_keys(found, rows, gone_rows, ["corpus_id"])
    return edit, pa.concat_tables(
        [
            corpus_changes.record_rows(written["corpus_id"], corpus_changes.PAPER),
            corpus_changes.record_rows(deleted["corpus_id"], corpus_changes.DELETED),
        ]
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
    new_keys: NewKeys | None = None,
    keys_uri: str,
    key_buckets: int,
    record: str,
) -> tuple[buckets.BucketLayout, dict[str, int], int]:
    """The papers table with a step's paper and abstract records applied (and the papers whose
    identifiers are among `new_keys` linked again, each bucket finding its own): the touched
    buckets (every bucket, given new keys) a few a task, one commit; the ids changed written
    under `record`. Returns the new layout, counts and record files written."""
    relink = new_keys is not None and new_keys.staged.kept > 0
    chosen = touched_buckets(p.layout.num_buckets, sides.all(), every=relink)
    return _edit_buckets(
        cfg,
        storage,
        p,
        chosen,
        _weight(sides.all()),
        partial(
            _papers_bucket,
            sides=sides,
            schemas=schemas,
            new_keys=new_keys,
            keys_uri=keys_uri,
            key_buckets=key_buckets,
        ),
        record,
        "papers",
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
) -> tuple[bucket_edits.BucketEdit, pa.Table]:
    """Bucket k of the citations table: the step's citation records upserted (keeping a citing
    sentence S2ORC recovered), deleted citations and those from or to deleted papers removed;
    and the citing ids whose rows it changed."""
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
    edit = bucket_edits.edit_bucket(
        p, storage, k, found, rows, gone, on=CITATION_KEY, fragment_rows=fragment_rows
    )
    written, deleted = bucket_edits.changed_keys(found, rows, gone, CITATION_KEY)
    citing = pa.concat_arrays([_ids(written["citing_id"]), _ids(deleted["citing_id"])])
    return edit, corpus_changes.record_rows(citing, corpus_changes.CITING)


def apply_citations(
    cfg: Config,
    storage: Storage,
    p: BucketPlan,
    citations: Staged | None,
    gone_citations: Staged | None,
    schemas: dict[str, pa.Schema],
    gone_papers: pa.Array,
    record: str,
) -> tuple[buckets.BucketLayout, dict[str, int], int]:
    """The citations table with a step's citation records and deletes applied: the touched
    buckets (every bucket when papers were deleted) a few a task, one commit; the citing ids
    changed written under `record`."""
    staged = [s for s in (citations, gone_citations) if s]
    chosen = touched_buckets(p.layout.num_buckets, staged, every=len(gone_papers) > 0)
    return _edit_buckets(
        cfg,
        storage,
        p,
        chosen,
        _weight(staged),
        partial(
            _citations_bucket,
            citations=citations,
            gone_citations=gone_citations,
            schemas=schemas,
            gone_papers=gone_papers,
        ),
        record,
        "citations",
    )
