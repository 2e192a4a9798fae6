"""The `export` stage (§3.4): the leak-free split written as CPR-eval, CPR-train and their corpus.

The export folder is the stage's published run folder: `cpr-eval.parquet`, `cpr-train.parquet`
and `corpus.parquet` in the format of `format.py` (loadable by the CPR loader and by
`datasets.load_dataset("parquet", …)`), a dataset card `README.md` and `stats.json`. The split
is recomputed with the pure function judge-negatives used (and checked to be the same settings);
leakage is asserted on the tables before anything is written. Abstracts are carried only under
an open licence (`dataset.open_licenses`); the rest carry ids, and `cpr hydrate` fills them from
the user's own S2 abstracts.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.cards.dataset_card import PAPER_SHARES, dataset_card, percent
from cpr_ray.config import license_code
from cpr_ray.corpus.tables import PinnedTable, papers_by_id
from cpr_ray.dataset.format import (
    CARD,
    CORPUS,
    CORPUS_TABLE,
    CPR_EVAL,
    CPR_TRAIN,
    EVAL_TABLE,
    EXPORT_FILES,
    POSITIVE,
    STATS,
    TRAIN_TABLE,
    file_name,
)
from cpr_ray.dataset.negatives import GROUPS, group_rank, split_fingerprint
from cpr_ray.dataset.provenance import provenance
from cpr_ray.dataset.split import (
    EVAL,
    HELD_OUT,
    TRAIN,
    assign_split,
    check_no_leakage,
    eval_papers,
)
from cpr_ray.errors import ConfigError, InputError
from cpr_ray.runs.stage_runner import Reads, StageOutput, StageRun, TableRecord, console, entry
from cpr_ray.stages import EXPORT as STAGE
from cpr_ray.stages import INGEST, JUDGE_NEGATIVES, POOL
from cpr_ray.storage.store import join
from cpr_ray.tables import duckdb_sql as duck

# the method's shares of positives from another field / domain (§3.4), for the card
PAPER_COLUMNS = [
    "corpus_id",
    "title",
    "abstract",
    "abstract_license",
    "year",
    "publication_date",
    "topics",
    "field",
    "domain",
]

# -- pure steps ----------------------------------------------------------------------------------


def split_tables(
    queries: pa.Table, split: pa.Table, negatives: pa.Table
) -> tuple[pa.Table, pa.Table]:
    """(CPR-eval, CPR-train) rows from pool's queries, their split and the judged negatives.

    Eval: the positive, then its kept negatives in pool order (group by group, by position),
    labels aligned. Train: the kept negatives, never an eval paper (held-out queries are gone).
    """
    tables = {
        "queries": queries.select(
            ["query_id", "query", "base_id", "positive_id", "field", "domain"]
        ),
        "split": split.select(["query_id", "split"]),
        "negatives": negatives.filter(negatives["kept"]).select(
            ["query_id", "candidate_id", "group", "position"]
        ),
        "withheld": pa.table({"id": eval_papers(split)}),
    }
    keys = "q.query_id, q.query, q.base_id, q.positive_id, q.field, q.domain"

    def rows(split_name: str, columns: str) -> pa.Table:
        return duck.query(
            f"""WITH n AS (SELECT *, {group_rank()} AS g FROM negatives),
                     q AS (SELECT q.* FROM queries q JOIN split s USING (query_id)
                           WHERE s.split = '{split_name}')
                SELECT q.query_id, q.query, q.base_id AS base_corpus_id, q.positive_id,
                       {columns}, q.field, q.domain
                FROM q LEFT JOIN n USING (query_id)
                GROUP BY {keys} ORDER BY q.field, q.query_id""",
            **tables,
        )

    def pool_order(column: str, where: str = "") -> str:
        return (
            f"coalesce(list(n.{column} ORDER BY n.g, n.position) "
            f"FILTER (WHERE n.candidate_id IS NOT NULL{where}), [])"
        )

    cpr_eval = rows(
        EVAL,
        f"""list_prepend(q.positive_id, {pool_order("candidate_id")}) AS candidate_ids,
            list_prepend('{POSITIVE}', {pool_order('"group"')}) AS candidate_groups""",
    )
    not_eval = " AND n.candidate_id NOT IN (SELECT id FROM withheld)"
    cpr_train = rows(TRAIN, f"{pool_order('candidate_id', not_eval)} AS negative_ids")
    return cpr_eval.cast(CPR_EVAL), cpr_train.cast(CPR_TRAIN)


def corpus_ids(cpr_eval: pa.Table, cpr_train: pa.Table) -> pa.Array:
    """Every paper the splits name: bases, positives, candidates and negatives."""
    return pc.unique(
        pa.concat_arrays(
            [
                cpr_eval["base_corpus_id"].combine_chunks(),
                pc.list_flatten(cpr_eval["candidate_ids"]).combine_chunks(),
                cpr_train["base_corpus_id"].combine_chunks(),
                cpr_train["positive_id"].combine_chunks(),
                pc.list_flatten(cpr_train["negative_ids"]).combine_chunks(),
            ]
        )
    )


def corpus_table(papers: pa.Table, open_licenses: Sequence[str]) -> pa.Table:
    """Papers in the export format: the abstract only under an open licence (as ingest
    normalised it), topics without their names' hierarchy, sorted by id."""
    return duck.query(
        """SELECT corpus_id, title,
                  CASE WHEN abstract_license IN (SELECT code FROM open) THEN abstract END
                      AS abstract,
                  abstract_license, year, publication_date,
                  list_transform(topics, lambda t: {'id': t.id, 'name': t.name, 'score': t.score,
                                               'subfield_id': t.subfield_id,
                                               'field_id': t.field_id,
                                               'domain_id': t.domain_id}) AS topics,
                  field, domain
           FROM papers ORDER BY corpus_id""",
        papers=papers.select(PAPER_COLUMNS),
        open=pa.table({"code": pa.array([license_code(x) for x in open_licenses], pa.string())}),
    ).cast(CORPUS)


def _count_by(table: pa.Table, column: str) -> dict[str, int]:
    counts = (
        table.group_by(column)
        .aggregate([(column, "count", pc.CountOptions(mode="all"))])  # nulls too
        .to_pylist()
    )
    return {
        str(r[column]): r[f"{column}_count"] for r in sorted(counts, key=lambda r: str(r[column]))
    }


def _share(queries: pa.Table, ids: pa.ChunkedArray, column: str) -> float | None:
    picked = queries.filter(pc.is_in(queries["query_id"], value_set=ids.combine_chunks()))
    if not picked.num_rows:
        return None
    return round(float(pc.mean(pc.cast(picked[column], pa.float64())).as_py()), 4)


def export_stats(
    queries: pa.Table,
    split: pa.Table,
    cpr_eval: pa.Table,
    cpr_train: pa.Table,
    corpus: pa.Table,
    papers: pa.Table,
    per_group: dict[str, int],
) -> dict[str, Any]:
    """Counts per split, field and domain; cross-field and cross-domain shares of positives
    against the method's; negatives per query and short pools; abstracts carried or withheld."""
    n_eval_neg = pc.subtract(pc.list_value_length(cpr_eval["candidate_ids"]), 1)
    n_train_neg = pc.list_value_length(cpr_train["negative_ids"])
    splits: dict[str, Any] = {}
    for name, table, negs, full in (
        (EVAL_TABLE, cpr_eval, n_eval_neg, len(GROUPS) * per_group[EVAL]),
        (TRAIN_TABLE, cpr_train, n_train_neg, len(GROUPS) * per_group[TRAIN]),
    ):
        splits[name] = {
            "queries": table.num_rows,
            "base_papers": len(pc.unique(table["base_corpus_id"])),
            "positives": len(pc.unique(table["positive_id"])),
            "negatives": int(pc.sum(negs).as_py() or 0),
            "negatives_per_query_mean": round(float(pc.mean(negs).as_py() or 0), 2),
            "negatives_per_query_min": int(pc.min(negs).as_py() or 0) if len(negs) else 0,
            "queries_short_of_negatives": int(pc.sum(pc.less(negs, full)).as_py() or 0),
            "per_field": _count_by(table, "field"),
            "per_domain": _count_by(table, "domain"),
            **{
                f"share_{c}": _share(queries, table["query_id"], c)
                for c in ("crosses_field", "crosses_domain")
            },
        }
    everything = pa.concat_arrays(
        [cpr_eval["query_id"].combine_chunks(), cpr_train["query_id"].combine_chunks()]
    )
    with_abstract = papers.filter(pc.is_valid(papers["abstract"]))["corpus_id"]
    without = corpus.filter(pc.is_null(corpus["abstract"]))
    withheld = without.filter(pc.is_in(without["corpus_id"], value_set=with_abstract))
    return {
        "splits": splits,
        "held_out_queries": int(pc.sum(pc.equal(split["split"], HELD_OUT)).as_py() or 0),
        "share_crosses_field": _share(queries, pa.chunked_array([everything]), "crosses_field"),
        "share_crosses_domain": _share(queries, pa.chunked_array([everything]), "crosses_domain"),
        "paper_shares": PAPER_SHARES,
        "corpus": {
            "papers": corpus.num_rows,
            "abstracts_included": corpus.num_rows - corpus["abstract"].null_count,
            "abstracts_withheld": withheld.num_rows,
            "withheld_by_license": _count_by(withheld, "abstract_license"),
            "without_abstract": papers.num_rows - len(with_abstract),
        },
        "leakage_check": "passed",
    }


# -- the stage -----------------------------------------------------------------------------------


def _export(
    run: StageRun,
    queries_uri: str,
    negatives_uri: str,
    papers: PinnedTable,
    fingerprint: str,
    negatives_complete: bool,
) -> StageOutput:
    ds = run.cfg.dataset
    if fingerprint != split_fingerprint(ds):
        raise ConfigError(
            f"export: the dataset settings differ from those judge-negatives bought negatives "
            f"for (dataset.* other than open_licenses); rerun it first: cpr build --stages "
            f"{JUDGE_NEGATIVES},{STAGE}"
        )
    queries = run.storage.read_parquet(queries_uri)
    split = assign_split(queries, eval_per_field=ds.eval_per_field, seed=ds.seed)
    negatives = run.storage.read_parquet(negatives_uri)
    cpr_eval, cpr_train = split_tables(queries, split, negatives)
    check_no_leakage(cpr_eval, cpr_train)  # a violation is a bug: nothing gets published

    ids = corpus_ids(cpr_eval, cpr_train)
    found = papers_by_id(run.storage, papers, ids, PAPER_COLUMNS)
    absent = pc.invert(pc.is_in(ids, value_set=found["corpus_id"].combine_chunks()))
    if pc.any(absent).as_py():
        raise InputError(
            f"export: {pc.sum(absent).as_py()} paper(s) of the splits are not in ingest's papers "
            f"({papers.uri}), e.g. {ids.filter(absent).to_pylist()[:5]}; pool ran on another "
            "corpus: rerun it (cpr build --stages pool,judge-negatives,export --force)"
        )
    corpus = corpus_table(found, ds.open_licenses)

    tables: dict[str, TableRecord] = {}
    for name, table in ((EVAL_TABLE, cpr_eval), (TRAIN_TABLE, cpr_train), (CORPUS_TABLE, corpus)):
        uri = join(run.out, file_name(name))
        run.storage.write_parquet(table, uri)
        tables[name] = {"uri": uri, "format": "parquet", "rows": table.num_rows}
    per_group = {EVAL: ds.eval_negatives_per_group, TRAIN: ds.train_negatives_per_group}
    stats = export_stats(queries, split, cpr_eval, cpr_train, corpus, found, per_group)
    prov = provenance(run.cfg, run.storage)
    created = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    run.storage.write_json(join(run.out, STATS), {**stats, "provenance": prov})
    card_uri = join(run.out, CARD)
    run.storage.write_text(card_uri, dataset_card(stats, prov, created, EXPORT_FILES))
    tables["card"] = {"uri": card_uri, "format": "markdown", "rows": 1}

    ev, tr = stats["splits"][EVAL_TABLE], stats["splits"][TRAIN_TABLE]
    console.print(
        f"  export: {EVAL_TABLE} {ev['queries']:,} queries ({ev['negatives_per_query_mean']} "
        f"negatives each), {TRAIN_TABLE} {tr['queries']:,} pairs, {stats['held_out_queries']:,} "
        f"held out; corpus {corpus.num_rows:,} papers ({stats['corpus']['abstracts_included']:,}"
        f" abstracts carried); another field {percent(stats['share_crosses_field'])} (method "
        f"79.9%), another domain {percent(stats['share_crosses_domain'])} (45.3%) → {run.out}"
    )
    # negatives missing for a reason a rerun may fix make this export provisional too
    return StageOutput(tables=tables, stats=stats, complete=negatives_complete)


def run_export(run: StageRun, reads: Reads) -> StageOutput:
    """Split pool's queries with judge-negatives' negatives into CPR-eval and CPR-train, with
    the corpus they cite at ingest's pinned version."""
    negatives = reads[JUDGE_NEGATIVES]
    return _export(
        run,
        queries_uri=reads[POOL]["tables"]["queries"]["uri"],
        negatives_uri=negatives["tables"]["negatives"]["uri"],
        papers=PinnedTable.of(reads[INGEST], "papers"),
        fingerprint=negatives["stats"]["split_fingerprint"],
        negatives_complete=negatives.get("complete", True),
    )


# run (or skip) the export and return its manifest
export = entry(STAGE)
