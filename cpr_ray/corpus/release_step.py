"""A release step's diff files fetched, parsed and applied in Ray tasks: no diff row reaches the
driver, and no task reads or writes another key bucket's part of a corpus table.

**Fetch and parse** (`stage`). One task per diff file downloads it into the step's folder (a
file there is complete or absent, and a rerun keeps it), parses it a batch at a time with
ingest's parser, and writes the rows into the key buckets of a staging table — bucket k of the
corpus table each record lands in: corpus id for papers and abstracts, citing id for citations —
with its rejects beside. It hands back counts per bucket (`Staged`).

**Apply** (`apply_papers`, `apply_citations`). The touched buckets (`touched_buckets`), a few
to a task (`task_groups`: a diff over thousands of buckets pays a few task starts), each read
its share of the staged records, find the rows they change in their own fragments, rebuild them
as ingest built them (`updates`), and return their edits as fragment metadata (`bucket_edits`);
the driver commits a table's edits as one version. Each task also writes the ids its buckets
really changed (`corpus_changes`), and a papers task the keys its papers gained and lost, staged
in the key buckets of the key table (`paper_keys`), which `apply_key_delta` then edits. The
citations of a deleted paper are found in its own bucket when it cites (bucketed by citing id),
but the citations *to* it may sit in any bucket: a step that deletes papers has every citations
bucket look for them in its `cited_id` column.

**Relink** (`stage_relinks`). New OpenAlex partitions are parsed into the OpenAlex key table the
same way, their key column alone also staged in its key buckets (`Side.keys`). Each key bucket
the new keys fall in looks them up in its bucket of the key table `paper_keys` (every paper's
DOI, MAG and PubMed keys → corpus id) and stages the papers found in their papers buckets, which
the papers edit then rebuilds like any other: only those buckets are read, and neither the new
keys nor the papers table is read by the driver.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray

from cpr_ray.config import Config
from cpr_ray.corpus import bucket_edits, corpus_changes, linking, paper_keys, updates
from cpr_ray.corpus.ingest import FIELD_COUNTS, add_field_counts
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
    (citations to deleted papers)."""
    if every:
        return list(range(num_buckets))
    return sorted({k for s in staged for k, n in s.rows_by_bucket.items() if n})


def _memory(cfg: Config) -> int:
    return cfg.refresh.task_memory_mb << 20


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


class BucketResult(NamedTuple):
    """What one bucket's edit gives its task: the edit (fragment metadata and counts), the ids
    it changed (`corpus_changes` rows) and, for papers, the rows it staged per key bucket of
    the key table's delta (`paper_keys.key_delta`)."""

    edit: bucket_edits.BucketEdit
    changed: pa.Table
    key_rows: dict[int, int] = {}
    field_counts: pa.Table | None = None  # papers per venue and field gained or lost


@dataclass(frozen=True)
class EditedBuckets:
    """What one edit task hands back, never rows: its buckets' edits, whether it wrote a file
    of the ids they changed, the key-table delta rows it staged per key bucket."""

    edits: tuple[bucket_edits.BucketEdit, ...]
    record_files: int
    key_rows: dict[int, int] = field(default_factory=dict)
    # (venue_id, field_id, papers gained or lost) its buckets' papers edits make: a few counts
    field_counts: tuple[tuple[str | None, int | None, int], ...] = ()


@dataclass(frozen=True)
class EditRound:
    """A round of bucket edits, committed: the table's new layout, the rows inserted, updated
    and deleted, the record files written, the key-table delta staged per key bucket."""

    layout: buckets.BucketLayout
    counts: dict[str, int]
    record_files: int
    key_rows: dict[int, int]
    field_counts: pa.Table  # what the papers edits changed in the papers per venue and field


def _add(into: dict[int, int], counts: dict[int, int]) -> dict[int, int]:
    for k, n in counts.items():
        into[k] = into.get(k, 0) + n
    return into


def _edit_group(
    i: int,
    *,
    groups: Sequence[Sequence[int]],
    fn: Callable[[int], BucketResult],
    storage: Storage,
    record: str,
    name: str,
) -> EditedBuckets:
    edits, changed, venues = [], [corpus_changes.RECORD.empty_table()], []
    key_rows: dict[int, int] = {}
    for k in groups[i]:
        done = fn(k)
        edits.append(done.edit)
        changed.append(done.changed)
        _add(key_rows, done.key_rows)
        venues += [] if done.field_counts is None else [done.field_counts]
    ids = pa.concat_tables(changed)
    if ids.num_rows:  # named for its first bucket: a retried task rewrites its own file
        storage.write_parquet(ids, join(record, f"{name}-{groups[i][0]:06d}.parquet"))
    counts = add_field_counts(venues).to_pydict()
    rows = tuple(zip(counts["venue_id"], counts["field_id"], counts["n"]))
    return EditedBuckets(tuple(edits), int(ids.num_rows > 0), key_rows, rows)


def _edit_buckets(
    cfg: Config,
    storage: Storage,
    p: BucketPlan,
    chosen: Sequence[int],
    weight: dict[int, int],
    edit: Callable[..., BucketResult],
    record: str,
    name: str,
) -> EditRound:
    """`edit(k, p=, storage=, fragment_rows=)` for each chosen bucket k, a few buckets a task
    (`task_groups`: about two tasks a CPU of the cluster), each task writing the ids its
    buckets changed under `record`; then one commit of every bucket's edit."""
    fn = partial(edit, p=p, storage=storage, fragment_rows=cfg.ingest.lance_fragment_rows)
    groups = task_groups(chosen, weight, _tasks(cfg))
    task = partial(_edit_group, groups=groups, fn=fn, storage=storage, record=record, name=name)
    done = run_buckets(len(groups), task, cfg.ingest.cpus_per_task, _memory(cfg))
    edits = [e for d in done for e in d.edits]
    key_rows: dict[int, int] = {}
    for d in done:
        _add(key_rows, d.key_rows)
    venues = [tuple(zip(*d.field_counts)) for d in done if d.field_counts]
    return EditRound(
        bucket_edits.commit(p, storage, edits),
        bucket_edits.total(edits),
        sum(d.record_files for d in done),
        key_rows,
        add_field_counts(
            [pa.Table.from_arrays([pa.array(c) for c in v], schema=FIELD_COUNTS) for v in venues]
        ),
    )


def _tasks(cfg: Config) -> int:
    """How many tasks a round of bucket edits is split into: two for each task the cluster's
    CPUs run at once, so a slow task is not the round's tail for long."""
    cpus = float(ray.cluster_resources().get("CPU", 1))
    return max(1, int(2 * cpus / cfg.ingest.cpus_per_task))


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
    relink: Staged | None = None  # papers a new OpenAlex partition relinks (`stage_relinks`)

    def all(self) -> list[Staged]:
        sides = (self.papers, self.abstracts, self.gone_papers, self.gone_abstracts, self.relink)
        return [s for s in sides if s]


RELINK = pa.schema([("corpus_id", pa.int64())])
KEYS = pa.schema([("key", pa.string())])


def _relink_bucket(
    j: int,
    *,
    storage: Storage,
    parsed: Staged,
    keys: BucketPlan,
    out: str,
    papers_buckets: int,
) -> Staged:
    """Key bucket j of a new partition's keys (a file per parsed batch) looked up in key bucket
    j of the key table: the papers found, into the papers buckets of `out`."""
    new = _read(storage, parsed, j, KEYS)["key"].unique()
    found = paper_keys.find(keys, storage, j, new)["corpus_id"].unique()
    if not len(found):
        return Staged(out)
    bucket = pa.array((found.to_numpy() % papers_buckets).astype(np.int32))
    write_partitions(pa.table({"corpus_id": found, BUCKET: bucket}), out, storage, f"keys-{j}")
    counts = pc.value_counts(bucket).to_pylist()
    return Staged(out, {c["values"]: c["counts"] for c in counts})


def stage_relinks(
    cfg: Config,
    storage: Storage,
    parsed: Staged,
    keys: BucketPlan,
    out: str,
    papers_buckets: int,
) -> Staged:
    """The papers a new OpenAlex partition relinks: its keys (written beside its rows,
    `Side.keys`) looked up in the key table (`paper_keys`), only in the key buckets they fall
    in, a few a task; the corpus ids found staged in their papers buckets under `out`."""
    chosen = sorted(k for k, n in parsed.rows_by_bucket.items() if n)
    fn = partial(
        _relink_bucket,
        storage=storage,
        parsed=parsed,
        keys=keys,
        out=out,
        papers_buckets=papers_buckets,
    )
    groups = task_groups(chosen, parsed.rows_by_bucket, _tasks(cfg))
    done = run_buckets(len(groups), partial(_each, groups=groups, fn=fn), cfg.ingest.cpus_per_task)
    return merge_staged(out, [s for d in done for s in d])


def _each(i: int, *, groups: Sequence[Sequence[int]], fn: Callable[[int], T]) -> list[T]:
    return [fn(k) for k in groups[i]]


def _papers_bucket(
    k: int,
    *,
    p: BucketPlan,
    storage: Storage,
    sides: PaperSides,
    schemas: dict[str, pa.Schema],
    keys_uri: str,
    key_buckets: int,
    key_delta: str,
    fragment_rows: int,
) -> BucketResult:
    """Bucket k of the papers table: its papers the step updates, re-abstracts, relinks or
    deletes, rebuilt from their records and current rows; the ids it changed, and the keys
    they gained and lost staged in the key buckets of `key_delta`."""
    papers = _read(storage, sides.papers, k, schemas["papers"])
    abstracts = _read(storage, sides.abstracts, k, schemas["abstracts"])
    forget = _ids(_read(storage, sides.gone_abstracts, k, schemas["abstracts"])["corpus_id"])
    gone = _ids(_read(storage, sides.gone_papers, k, schemas["papers"])["corpus_id"])
    relink = _ids(_read(storage, sides.relink, k, RELINK)["corpus_id"])
    ids = pa.concat_arrays(
        [_ids(papers["corpus_id"]), _ids(abstracts["corpus_id"]), relink, forget]
    )
    ids = ids.unique()
    wanted = pa.concat_arrays([ids, gone]).unique()
    if not len(wanted):  # a bucket the relink visits and finds nothing in: no read, no write
        edit = bucket_edits.BucketEdit(k, counts={"inserted": 0, "updated": 0, "deleted": 0})
        return BucketResult(edit, corpus_changes.RECORD.empty_table())
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
    changed = pa.concat_tables(
        [
            corpus_changes.record_rows(written["corpus_id"], corpus_changes.PAPER),
            corpus_changes.record_rows(deleted["corpus_id"], corpus_changes.DELETED),
        ]
    )
    delta = paper_keys.key_delta(found, rows, key_buckets)
    if delta.num_rows:  # named for the papers bucket: a retried task rewrites its own files
        write_partitions(delta, key_delta, storage, f"papers-{k}")
    counts = pc.value_counts(delta[BUCKET]).to_pylist()
    venues = updates.field_count_delta(found, rows)
    return BucketResult(edit, changed, {c["values"]: c["counts"] for c in counts}, venues)


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
    keys_uri: str,
    key_buckets: int,
    key_delta: str,
    record: str,
) -> EditRound:
    """The papers table with a step's paper and abstract records applied (and the papers a new
    OpenAlex partition relinks linked again): the touched buckets a few a task, one commit; the
    ids changed written under `record`, the key table's delta staged under `key_delta`."""
    return _edit_buckets(
        cfg,
        storage,
        p,
        touched_buckets(p.layout.num_buckets, sides.all()),
        _weight(sides.all()),
        partial(
            _papers_bucket,
            sides=sides,
            schemas=schemas,
            keys_uri=keys_uri,
            key_buckets=key_buckets,
            key_delta=key_delta,
        ),
        record,
        "papers",
    )


def _keys_bucket(
    j: int, *, p: BucketPlan, storage: Storage, staged: str, fragment_rows: int
) -> BucketResult:
    delta = paper_keys.staged_delta(storage, staged, j)
    edit = paper_keys.edit_bucket(j, p=p, storage=storage, delta=delta, fragment_rows=fragment_rows)
    return BucketResult(edit, corpus_changes.RECORD.empty_table())


def apply_key_delta(
    cfg: Config, storage: Storage, p: BucketPlan, staged: str, key_rows: dict[int, int]
) -> buckets.BucketLayout:
    """The key table with a papers edit's delta (staged under `staged`, `key_rows` per key
    bucket) applied: the key buckets it touches a few a task, one commit; the new layout."""
    chosen = sorted(j for j, n in key_rows.items() if n)
    edit = partial(_keys_bucket, staged=staged)
    return _edit_buckets(cfg, storage, p, chosen, key_rows, edit, "", "keys").layout


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
) -> BucketResult:
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
    return BucketResult(edit, corpus_changes.record_rows(citing, corpus_changes.CITING))


def apply_citations(
    cfg: Config,
    storage: Storage,
    p: BucketPlan,
    citations: Staged | None,
    gone_citations: Staged | None,
    schemas: dict[str, pa.Schema],
    gone_papers: pa.Array,
    record: str,
) -> EditRound:
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
