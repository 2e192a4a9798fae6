"""The corpus half of the nightly refresh: Semantic Scholar's incremental diffs applied to the
corpus tables, each release step committed through the ingest manifest. Rerunning the later
stages, the leases and the removal of old versions are orchestration (`pipeline.refresh`).

**Corpus.** From the release applied last (the ingest manifest's ``corpus.release``; first
``refresh.base_release``) to S2's latest, each release step's ``update_files`` are upserted
and its ``delete_files`` removed by key in the Lance tables, papers rebuilt as ingest built
them (`updates`): the files fetched and parsed in tasks, the step applied to the touched key
buckets a few per task (`release_step`, `bucket_edits`), so no diff row reaches the driver.
OpenAlex snapshot partitions newer than the pinned one are parsed into the OpenAlex key table
first, and the papers they match, found in the papers' key table (`paper_keys`) in the key
buckets the new keys fall in, are relinked (neither the keys nor the papers table pass through
the driver); the new snapshot is then the pinned one. The bucket tasks count what each step
inserted, updated and deleted (as Lance's change API would) and write the ids it changed
(`corpus_changes`). The venues table is recounted.

**Commit.** The ingest manifest is the commit of a step: it records the applied release, the
Lance version of each table and a new ``run_id`` (``{ingest run}+{release}``), which is how every
later stage sees that its input changed. A refresh killed before a commit leaves the tables at
a newer version than the manifest records; the next one (and any stage that reads them, see
`stage.require_manifest`) notices, and the refresh restores the recorded version before
applying the step again — so an interrupted refresh ends where an uninterrupted one does.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from cpr_ray.config import Config
from cpr_ray.corpus import corpus_changes, paper_keys, records, release_step
from cpr_ray.corpus.ingest import (
    FIELD_COUNTS_TABLE,
    add_field_counts,
    build_venues,
    count_fields,
)
from cpr_ray.corpus.inputs import TEXT_SUFFIXES
from cpr_ray.corpus.parsing import ParseRecords, ParseWorks, rows_schema
from cpr_ray.corpus.s2_api import DiffStep, S2DatasetsClient, public_url
from cpr_ray.corpus.shards import LINES
from cpr_ray.corpus.table_changes import Corpus
from cpr_ray.errors import ConfigError, InputError, StorageError
from cpr_ray.runs.ray_runtime import ensure_ray
from cpr_ray.runs.stage_runner import Manifest, console, read_manifest, write_manifest
from cpr_ray.stages import INGEST
from cpr_ray.storage.store import Storage, join
from cpr_ray.tables import buckets
from cpr_ray.tables.buckets import BUCKET, bucketed_dataset

DATASETS_ORDER = ("papers", "abstracts", "citations")


@dataclass
class StepReport:
    """What one commit changed, for the manifest's history and the summary."""

    label: str  # "2026-11-25 → 2026-12-02" or "openalex updated_date … → …"
    source: str = "s2"  # s2 | openalex
    records: dict[str, dict[str, int]] = field(default_factory=dict)
    changes: dict[str, dict[str, int]] = field(default_factory=dict)
    # the folder of the ids the step changed and how many files its tasks wrote there
    # (`corpus_changes`); None: a commit that changes no row (a rewrite into buckets)
    changed_ids: dict[str, Any] | None = None
    # papers per venue and field the step's papers edits gained or lost (not in the history)
    field_counts: pa.Table | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "step": self.label,
            "source": self.source,
            "records": self.records,
            "changes": self.changes,
            corpus_changes.RECORD_KEY: self.changed_ids,
        }

    def start_record(self, run: RefreshRun, manifest: Manifest, state: dict[str, Any]) -> str:
        """The step's record folder (`corpus_changes`), emptied of what a killed try wrote:
        named for the step's place in the history, which a retried step keeps."""
        uri = join(manifest["output"], "changes", f"{len(state['applied']) + 1:05d}")
        run.storage.delete_dir(uri)
        self.changed_ids = {"uri": uri, "files": 0}
        return uri

    def recorded(self, files: int) -> None:
        assert self.changed_ids is not None
        self.changed_ids["files"] += files


@dataclass
class Applied:
    """What `apply_diffs` did: the corpus it leaves, and the steps it committed."""

    corpus: Corpus
    start_release: str
    state: dict[str, Any]  # the ingest manifest's `corpus` record after the last commit
    reports: list[dict[str, Any]]  # the steps this refresh committed (`StepReport.as_dict`)
    restored: list[str]  # tables put back from an earlier refresh's unfinished step


def record_schema(name: str) -> pa.Schema:
    """The parsed-record shape of one input (`records.SPECS`), as ingest stages it."""
    spec = records.SPECS[name]
    return rows_schema(ParseRecords(spec, 1, 1)(LINES.empty_table()).schema)


# -- OpenAlex: partitions newer than the pinned snapshot -----------------------------------------

PARTITION = re.compile(r"updated_date=(\d{4}-\d{2}-\d{2})")


def snapshot_date(label: str | None) -> str | None:
    """The newest OpenAlex partition date a snapshot label names (`…updated_date<=2026-11-20`)."""
    m = re.search(r"(\d{4}-\d{2}-\d{2})", label or "")
    return m.group(1) if m else None


def new_work_files(cfg: Config, storage: Storage, pinned: str | None) -> tuple[list[str], str]:
    """Works shards in partitions newer than `pinned`, and the newest partition date seen."""
    assert cfg.input is not None
    works = join(cfg.input.openalex, "works")
    files = [i.path for i in storage.list_files(works, TEXT_SUFFIXES) if i.size]
    is_s3 = storage.resolve(works).is_s3
    newer, newest = [], pinned or ""
    for path in files:
        m = PARTITION.search(path)
        if m is None:
            continue
        newest = max(newest, m.group(1))
        if pinned is None or m.group(1) > pinned:
            newer.append(f"s3://{path}" if is_s3 else path)
    return (newer if pinned is not None else []), newest


# -- applying changes ----------------------------------------------------------------------------

NO_CHANGES = {"inserted": 0, "updated": 0, "deleted": 0}
CITATION_SIDES = [("citations", "update"), ("citations", "delete")]


def _schemas(key_buckets: int) -> dict[str, pa.Schema]:
    """The staged record shapes a bucket's task reads."""
    works = ParseWorks(records.SPECS["works"], key_buckets, 1)(LINES.empty_table()).schema
    return {
        **{name: record_schema(name) for name in ("papers", "abstracts", "citations", "s2orc")},
        "works": rows_schema(works),
    }


def _plan(run: RefreshRun, corpus: Corpus, name: str) -> buckets.BucketPlan:
    ds = corpus.table(name)
    return buckets.plan(corpus.bucket_layout(name), run.storage, ds.uri, ds.version)


def _apply_papers(
    run: RefreshRun, corpus: Corpus, sides: release_step.PaperSides, report: StepReport
) -> dict[str, int]:
    """Rebuild and write every paper the records touch (or the relink finds), a few touched
    buckets a task; then the key table's share of the change (the keys those papers gained and
    lost), in the key buckets it falls in."""
    keys = _key_table(run, corpus)
    assert report.changed_ids is not None
    delta = join(run.work, "key-delta")
    run.storage.delete_dir(delta)  # what a killed try staged
    done = release_step.apply_papers(
        run.cfg,
        run.storage,
        _plan(run, corpus, "papers"),
        sides,
        _schemas(keys.layout.num_buckets),
        keys_uri=corpus.manifest["tables"]["openalex_keys"]["uri"],
        key_buckets=keys.layout.num_buckets,
        key_delta=delta,
        record=report.changed_ids["uri"],
    )
    corpus.layouts["papers"] = done.layout
    report.recorded(done.record_files)
    report.field_counts = add_field_counts(
        [done.field_counts, *([] if report.field_counts is None else [report.field_counts])]
    )
    if done.key_rows:
        corpus.layouts[paper_keys.TABLE] = release_step.apply_key_delta(
            run.cfg, run.storage, keys, delta, done.key_rows
        )
    run.storage.delete_dir(delta)
    return done.counts


def _key_table(run: RefreshRun, corpus: Corpus) -> buckets.BucketPlan:
    """The key table at its current version; built from the papers table first when the
    corpus was ingested before it existed (once: the next commit records it)."""
    if paper_keys.TABLE not in corpus.uris:
        n = _key_buckets(run, corpus)
        uri = join(corpus.manifest["output"], f"{paper_keys.TABLE}.lance")
        console.print(
            f"  the corpus has no key table ({paper_keys.TABLE}: ingested before it existed); "
            f"building it once from the papers table into {n} key bucket(s)"
        )
        corpus.layouts[paper_keys.TABLE] = paper_keys.build(
            run.storage,
            _plan(run, corpus, "papers"),
            uri,
            n,
            join(run.work, "key-table"),
            cpus=run.cfg.ingest.cpus_per_task,
            fragment_rows=run.cfg.ingest.lance_fragment_rows,
        )
        corpus.uris[paper_keys.TABLE] = uri
    return _plan(run, corpus, paper_keys.TABLE)


def _gone_ids(storage: Storage, staged: release_step.Staged | None) -> pa.Array:
    """The ids of the papers a step deletes (a key column, not rows): every citations bucket
    looks for citations to them."""
    if staged is None or not staged.kept:
        return pa.array([], pa.int64())
    return (
        bucketed_dataset(storage, staged.uri)
        .to_table(columns=["corpus_id"])["corpus_id"]
        .combine_chunks()
        .cast(pa.int64())
        .unique()
    )


@dataclass(frozen=True)
class RefreshRun:
    """One refresh of one build root: what every step below reads. The steps are functions over
    it and over the manifest, corpus and release state each is handed and returns."""

    cfg: Config
    storage: Storage
    client: S2DatasetsClient
    keyless: bool  # no API key in the environment: requests go without one
    work: str  # ROOT/_refresh: the downloads and the rejects

    @classmethod
    def open(cls, cfg: Config, client: S2DatasetsClient | None = None) -> RefreshRun:
        cfg.require("storage.root", "input")
        storage = Storage(cfg.storage)
        rc = cfg.refresh
        return cls(
            cfg,
            storage,
            client
            or S2DatasetsClient(
                rc.api_url,
                os.environ.get(rc.api_key_env),
                requests_per_second=rc.requests_per_second,
                max_retries=rc.max_retries,
                timeout_s=rc.timeout_s,
            ),
            keyless=client is None and not os.environ.get(rc.api_key_env),
            work=join(storage.root, "_refresh"),
        )


# -- state -----------------------------------------------------------------------------------------


def _manifest(run: RefreshRun) -> Manifest:
    manifest = read_manifest(run.storage, INGEST)
    if manifest is None:
        raise StorageError(
            f"no corpus under {run.storage.root}: a refresh updates a built one; run "
            "cpr build --stages ingest first"
        )
    return manifest


def _corpus_state(run: RefreshRun, manifest: Manifest) -> dict[str, Any]:
    state = manifest.get("corpus")
    if state:
        return state
    base = run.cfg.refresh.base_release
    if not base:
        raise ConfigError(
            "refresh.base_release is not set: name the S2 release the bulk shards under "
            "input.s2 come from (e.g. --set refresh.base_release=2026-11-25)"
        )
    return {
        "base_release": base,
        "release": base,
        "applied": [],
        "openalex_snapshot": manifest["stats"].get("openalex_snapshot"),
        # what `corpus_changes.changes_between` counts the first step's changes from
        "ingest_run_id": manifest["run_id"],
    }


def _field_counts(
    run: RefreshRun, manifest: Manifest, corpus: Corpus, report: StepReport
) -> pa.Table:
    """Papers per venue and field after the step: the counts the last commit kept plus what
    the step's papers edits changed (exact: integer counts, the order fixed by
    `add_field_counts`); recounted over every papers bucket where no counts were kept (a
    corpus ingested before they were)."""
    kept = manifest["tables"].get(FIELD_COUNTS_TABLE)
    if kept is None:
        papers = corpus.table("papers")
        p = buckets.plan(corpus.bucket_layout("papers"), run.storage, papers.uri, papers.version)
        return count_fields(run.storage, p, run.cfg.ingest.cpus_per_task)
    changed = [] if report.field_counts is None else [report.field_counts]
    return add_field_counts([run.storage.read_parquet(kept["uri"]), *changed])


def _commit(
    run: RefreshRun,
    manifest: Manifest,
    corpus: Corpus,
    state: dict[str, Any],
    report: StepReport,
) -> Manifest:
    """Publish what the tables now hold: the step is applied once this write lands."""
    stem = f"{_slug(state['release'])}-{len(state['applied'])}"
    counts = _field_counts(run, manifest, corpus, report)
    counts_uri = join(manifest["output"], f"venue-field-counts-{stem}.parquet")
    run.storage.write_parquet(counts, counts_uri)
    venues = build_venues(
        run.storage,
        counts,
        manifest["tables"]["s2_venues"]["uri"],
        manifest["tables"]["openalex_sources"]["uri"],
    )
    venues_uri = join(manifest["output"], f"venues-{stem}.parquet")
    run.storage.write_parquet(venues, venues_uri)
    tables = dict(manifest["tables"])
    for name in corpus.names:
        ds = corpus.table(name)
        tables[name] = {
            **tables.get(name, {"uri": corpus.uri(name), "format": "lance"}),
            "version": ds.version,
            "rows": ds.count_rows(),
            "layout": corpus.bucket_layout(name).as_dict(),
        }
    tables["venues"] = {**tables["venues"], "uri": venues_uri, "rows": venues.num_rows}
    tables[FIELD_COUNTS_TABLE] = {"uri": counts_uri, "format": "parquet", "rows": counts.num_rows}
    base_run = manifest["output"].rstrip("/").rsplit("/", 1)[1]
    applied = [*state["applied"], report.as_dict()] if report.label else state["applied"]
    stamp = f"{base_run}+{state['release']}+{len(applied)}"
    if report.label:  # the run id each step published: what `corpus_changes` counts from
        applied[-1]["run_id"] = stamp
        state = {**state, "applied": applied}
    new: Manifest = {
        **manifest,
        "tables": tables,
        "corpus": state,
        "run_id": stamp,
        "refreshed": dt.datetime.now(dt.timezone.utc).isoformat(),
    }
    # one writer: the refresh holds the root's lease (`pipeline.refresh`) while it commits
    write_manifest(run.storage, new)
    corpus.manifest = new
    return new


# -- steps -----------------------------------------------------------------------------------------


def _stage(
    run: RefreshRun,
    corpus: Corpus,
    step_dir: str,
    steps: dict[str, DiffStep],
    report: StepReport,
    wanted: list[tuple[str, str]],
) -> dict[tuple[str, str], release_step.Staged | None]:
    """Sides (dataset, update|delete) of a step fetched and parsed into the key buckets of their
    table, all in one round of tasks (`release_step.stage`); rejects written and counted.
    Downloads are kept for a rerun of the step (its URLs change, the files' order does not)."""
    sides: dict[tuple[str, str], release_step.Side] = {}
    for name, kind in wanted:
        step = steps.get(name)
        if step is None:
            continue
        urls = step.update_files if kind == "update" else step.delete_files
        table = "citations" if name == "citations" else "papers"
        out = join(step_dir, "parsed", f"{name}-{kind}")
        run.storage.delete_dir(out)  # what a killed try parsed: parsed again
        sides[name, kind] = release_step.Side(
            tuple(join(step_dir, name, f"{kind}-{i:05d}.jsonl.gz") for i in range(len(urls))),
            ParseRecords(
                records.SPECS[name],
                corpus.bucket_layout(table).num_buckets,
                run.cfg.ingest.raw_line_limit,
            ),
            out,
            join(run.work, "rejects", f"{_slug(step.to_release)}-{name}-{kind}"),
            urls=tuple(urls),
        )
    started = time.perf_counter()
    staged = release_step.stage(run.cfg, run.storage, list(sides.values()), run.client.fetcher())
    seconds = time.perf_counter() - started
    for ((name, kind), side), found in zip(sides.items(), staged):
        if side.urls:
            console.print(
                f"    {name} {kind}: {len(side.urls)} file(s), {found.fetched_bytes / 1e6:,.1f} "
                f"MB fetched, {found.kept:,} records (with the step's other files: "
                f"{seconds:,.0f} s)",
                highlight=False,
            )
        _count(run, steps[name], name, kind, found, report)
    return {key: dict(zip(sides, staged)).get(key) for key in wanted}


def _count(
    run: RefreshRun,
    step: DiffStep,
    name: str,
    kind: str,
    staged: release_step.Staged,
    report: StepReport,
) -> None:
    counts = report.records.setdefault(name, {})
    counts[f"{kind}_records"] = staged.kept
    counts[f"{kind}_rejected"] = staged.rejected
    counts[f"{kind}_skipped"] = staged.skipped
    total = staged.kept + staged.rejected + staged.skipped
    limit = run.cfg.ingest.max_reject_rate
    if total and staged.rejected / total > limit:
        raise InputError(
            f"{staged.rejected:,} of {total:,} {kind} records of {name} in release step "
            f"{step.from_release} → {step.to_release} were rejected (> "
            f"ingest.max_reject_rate={limit:.1%}); reasons in {run.work}/rejects"
        )


def _apply_step(
    run: RefreshRun, corpus: Corpus, steps: dict[str, DiffStep], report: StepReport
) -> dict[str, dict[str, int]]:
    """The step's papers and abstracts, then its citations (and those of deleted papers), each
    table in one commit; returns what each changed."""
    one = next(iter(steps.values()))
    step_dir = join(run.work, "downloads", _slug(one.to_release))

    paper_sides = [("papers", "update"), ("abstracts", "update")]
    paper_sides += [("papers", "delete"), ("abstracts", "delete")]
    found = _stage(run, corpus, step_dir, steps, report, paper_sides)
    sides = release_step.PaperSides(*(found[key] for key in paper_sides))
    console.print(f"  {report.label}: papers")
    papers = _apply_papers(run, corpus, sides, report)
    staged = _stage(run, corpus, step_dir, steps, report, CITATION_SIDES)
    citations, gone_citations = (staged[key] for key in CITATION_SIDES)
    console.print(f"  {report.label}: citations")
    assert report.changed_ids is not None
    cited = release_step.apply_citations(
        run.cfg,
        run.storage,
        _plan(run, corpus, "citations"),
        citations,
        gone_citations,
        _schemas(1),
        _gone_ids(run.storage, sides.gone_papers),
        report.changed_ids["uri"],
    )
    corpus.layouts["citations"] = cited.layout
    report.recorded(cited.record_files)
    return {"papers": papers, "citations": cited.counts}


def _key_buckets(run: RefreshRun, corpus: Corpus) -> int:
    """The key table's bucket count (its folders say), so new keys land where lookups look."""
    loc = run.storage.resolve(corpus.manifest["tables"]["openalex_keys"]["uri"])
    found = [
        int(d.rsplit("=", 1)[1])
        for d in run.storage.list_dirs(loc.uri)
        if f"/{BUCKET}=" in d and int(d.rsplit("=", 1)[1]) >= 0
    ]
    return max(found) + 1 if found else run.cfg.ingest.num_buckets


def _openalex(
    run: RefreshRun, manifest: Manifest, corpus: Corpus, state: dict[str, Any]
) -> Manifest:
    """Parse works partitions newer than the pinned snapshot into the OpenAlex key table, their
    keys alone beside; relink the papers they match (found in the key table `paper_keys`, in
    the key buckets the new keys fall in); pin the newer snapshot."""
    pinned = snapshot_date(state.get("openalex_snapshot"))
    files, newest = new_work_files(run.cfg, run.storage, pinned)
    if not files:
        return manifest
    label = f"openalex updated_date {pinned} → {newest}"
    console.print(f"  {label}: {len(files)} new works shard(s)")
    report = StepReport(label, source="openalex")
    report.start_record(run, manifest, state)
    n = _key_buckets(run, corpus)
    keys_uri = manifest["tables"]["openalex_keys"]["uri"]
    step = ParseWorks(records.SPECS["works"], n, run.cfg.ingest.raw_line_limit)
    part = f"openalex-{newest}"  # named for the snapshot: a retried refresh rewrites its files
    work = join(run.work, part)
    run.storage.delete_dir(work)  # what a killed try staged: staged again
    rejects, parsed = join(run.work, "rejects", part), join(work, "parsed")
    [staged] = release_step.stage(
        run.cfg,
        run.storage,
        [release_step.Side(tuple(files), step, keys_uri, rejects, part=part, keys=parsed)],
    )
    report.records["works"] = {
        "update_records": staged.kept,
        "update_rejected": staged.rejected,
    }
    relink = release_step.stage_relinks(
        run.cfg,
        run.storage,
        release_step.Staged(parsed, staged.rows_by_bucket),
        _key_table(run, corpus),
        join(work, "relink"),
        corpus.bucket_layout("papers").num_buckets,
    )
    report.changes = {
        "papers": _apply_papers(run, corpus, release_step.PaperSides(relink=relink), report),
        "citations": dict(NO_CHANGES),
    }
    state = {**state, "openalex_snapshot": f"openalex updated_date<={newest}"}
    manifest = _commit(run, manifest, corpus, state, report)
    run.storage.delete_dir(work)
    return manifest


# -- the whole refresh -----------------------------------------------------------------------------


def plan(run: RefreshRun, release: str) -> tuple[str, list[dict[str, DiffStep]]]:
    """S2's latest release and the steps to it, each step's datasets together."""
    latest = run.client.latest()
    if latest == release:
        return latest, []
    per_dataset = {
        name: run.client.diffs(release, latest, name) for name in run.cfg.refresh.datasets
    }
    order: list[tuple[str, str]] = []
    for steps in per_dataset.values():
        for s in steps:
            if (s.from_release, s.to_release) not in order:
                order.append((s.from_release, s.to_release))
    order.sort(key=lambda pair: pair[1])
    grouped: list[dict[str, DiffStep]] = []
    for pair in order:
        grouped.append(
            {
                name: s
                for name, steps in per_dataset.items()
                for s in steps
                if (s.from_release, s.to_release) == pair
            }
        )
    return latest, grouped


def apply_diffs(run: RefreshRun) -> Applied:
    """Bring the corpus to S2's latest release (and OpenAlex's newest partitions), committing
    each step; a step an earlier, killed refresh began is restored and applied again."""
    storage = run.storage
    manifest = _manifest(run)
    corpus = Corpus(storage, manifest)
    state = _corpus_state(run, manifest)
    restored = corpus.restore_unfinished()
    if restored:
        console.print(
            "[bold]refresh[/]: an earlier refresh stopped before its commit; tables back to "
            f"their published versions ({', '.join(restored)}), applying its step again"
        )
    if run.keyless:
        console.print(
            f"  [yellow]note[/]: ${run.cfg.refresh.api_key_env} is empty: requests go "
            "without an API key"
        )
    start_release = state["release"]
    latest, steps = plan(run, start_release)
    console.print(
        f"[bold]refresh[/]: corpus at S2 release {start_release}; latest {latest}; "
        f"{len(steps)} release step(s) to apply"
    )
    ensure_ray(run.cfg.ray)
    before = len(state["applied"])
    manifest = _openalex(run, manifest, corpus, state)
    state = manifest.get("corpus", state)
    for group in steps:
        one = next(iter(group.values()))
        report = StepReport(f"{one.from_release} → {one.to_release}")
        report.start_record(run, manifest, state)
        report.changes = _apply_step(run, corpus, group, report)
        state = {**state, "release": one.to_release}
        manifest = _commit(run, manifest, corpus, state, report)
        state = manifest["corpus"]
        storage.delete_dir(join(run.work, "downloads", _slug(one.to_release)))
        _print_step(report)
    reports = state["applied"][before:]
    if reports and _rebucket(run, corpus):
        manifest = _commit(run, manifest, corpus, state, StepReport(""))
    return Applied(corpus, start_release, state, reports, restored)


def _rebucket(run: RefreshRun, corpus: Corpus) -> bool:
    """Rewrite each table whose appended, bucket-mixing fragments passed
    `refresh.rebucket_share` back into one-bucket fragments (`buckets.rewrite`); the next
    commit records the new layout. Lance's own compaction would merge fragments of
    different buckets, so it is not used."""
    rewritten = False
    for name in ("papers", "citations"):
        found = corpus.bucket_layout(name)
        ds = corpus.table(name)
        p = buckets.plan(found, run.storage, ds.uri, ds.version)
        if not p.mixed or p.mixed_rows <= run.cfg.refresh.rebucket_share * p.rows:
            continue
        console.print(
            f"  {name}: {p.mixed_rows:,} of {p.rows:,} rows in fragments that mix buckets "
            f"(> refresh.rebucket_share={run.cfg.refresh.rebucket_share:.0%}); rewriting "
            f"the table into its {found.num_buckets} key buckets"
        )
        corpus.layouts[name] = buckets.rewrite(
            p,
            run.storage,
            fragment_rows=run.cfg.ingest.lance_fragment_rows,
            cpus=run.cfg.ingest.cpus_per_task,
        )
        rewritten = True
    return rewritten


def remove_old_versions(run: RefreshRun, corpus: Corpus) -> dict[str, int]:
    """Table versions older than `refresh.retain_versions_days` (the caller checks that no
    reader is reading them)."""
    older_than = dt.timedelta(days=run.cfg.refresh.retain_versions_days)
    return {
        name: corpus.table(name).cleanup_old_versions(older_than=older_than).old_versions
        for name in corpus.names
    }


def _slug(release: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", release)


def _print_step(report: StepReport) -> None:
    rec = "; ".join(
        f"{name} +{c.get('update_records', 0):,}/-{c.get('delete_records', 0):,}"
        + (
            f" ({c['update_rejected'] + c.get('delete_rejected', 0):,} rejected)"
            if c.get("update_rejected") or c.get("delete_rejected")
            else ""
        )
        for name, c in report.records.items()
    )
    ch = "; ".join(
        f"{name}: {c['inserted']:,} new, {c['updated']:,} changed, {c['deleted']:,} removed"
        for name, c in report.changes.items()
    )
    console.print(f"  applied {report.label}: records {rec or 'none'} → {ch}")


__all__ = ("Applied", "RefreshRun", "apply_diffs", "public_url", "snapshot_date")
