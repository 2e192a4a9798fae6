"""Diff records → the corpus rows they change: pure functions over Arrow tables (DuckDB inside).

A release step brings S2 paper and abstract records (upserts by corpus id) and citation records
(upserts by citing and cited id). A changed paper is rebuilt the way ingest built it — newest
record, best OpenAlex match, abstract — by feeding `linking.assemble_papers` the new records
plus, for what the step does not carry, the paper's current row turned back into record shape:
an abstract-only change keeps the paper's metadata, a metadata change keeps its S2 abstract,
and a paper whose OpenAlex work changed is relinked from its own row. Because every input of
a rebuilt row is either in the step or in the row itself, applying a step twice gives the row
it gave once: a refresh killed mid-step can simply apply the step again.
"""

from __future__ import annotations

import pyarrow as pa

from cpr_ray.corpus import linking
from cpr_ray.tables import duckdb_sql as duck

# the parsed-record shapes `linking.assemble_papers` reads (see `records.S2_PAPERS`/`S2_ABSTRACTS`)
PAPER_RECORD_COLUMNS = (
    "corpus_id, title, venue, venue_id, year, publication_date, doi, mag_id, pmid, arxiv_id"
)


def paper_records(rows: pa.Table) -> pa.Table:
    """Corpus rows → S2 paper records (no `updated`: any record in a diff is newer)."""
    return duck.query(
        f"SELECT {PAPER_RECORD_COLUMNS}, NULL::TIMESTAMP AS updated FROM rows", rows=rows
    )


def abstract_records(rows: pa.Table) -> pa.Table:
    """The S2 abstracts of corpus rows as abstract records (OpenAlex ones come from the match)."""
    return duck.query(
        "SELECT corpus_id, abstract, abstract_license AS license, NULL::TIMESTAMP AS updated "
        "FROM rows WHERE abstract_source = 's2'",
        rows=rows,
    )


def forget_abstracts(rows: pa.Table, ids: pa.Array) -> pa.Table:
    """Rows whose S2 abstract a step deletes, as if they had none (an OpenAlex one may return
    through the match)."""
    return duck.query(
        """SELECT * REPLACE (CASE WHEN abstract_source = 's2' AND corpus_id IN
            (SELECT unnest(ids) FROM gone) THEN NULL ELSE abstract_source END AS abstract_source)
        FROM rows""",
        rows=rows,
        gone=pa.table({"ids": pa.array([ids.to_pylist()], pa.list_(pa.int64()))}),
    ).cast(rows.schema)


def rebuild_inputs(
    papers: pa.Table, abstracts: pa.Table, current: pa.Table, relink: pa.Array
) -> tuple[pa.Table, pa.Table]:
    """The paper and abstract records to rebuild from: the step's own records first, then the
    current rows of papers the step touches only in part (an abstract, or an OpenAlex work:
    `relink` ids). An abstract for a paper the corpus does not hold makes no paper."""
    current_records = paper_records(current)
    kept_papers = duck.query(
        f"""SELECT {PAPER_RECORD_COLUMNS}, updated FROM papers
        UNION ALL BY NAME
        SELECT * FROM cur
        WHERE corpus_id NOT IN (SELECT corpus_id FROM papers)
          AND (corpus_id IN (SELECT corpus_id FROM abstracts)
               OR corpus_id IN (SELECT unnest(ids) FROM relink))""",
        papers=papers,
        abstracts=abstracts,
        cur=current_records,
        relink=pa.table({"ids": pa.array([relink.to_pylist()], pa.list_(pa.int64()))}),
    )
    kept_abstracts = duck.query(
        """SELECT corpus_id, abstract, license, updated FROM abstracts
        UNION ALL BY NAME
        SELECT * FROM cur WHERE corpus_id NOT IN (SELECT corpus_id FROM abstracts)""",
        abstracts=abstracts,
        cur=abstract_records(current),
    )
    return kept_papers, kept_abstracts


def rebuilt_papers(
    papers: pa.Table, abstracts: pa.Table, works: pa.Table, num_buckets: int
) -> pa.Table:
    """Rows of the `papers` table for these records, linked to the given OpenAlex key rows."""
    keys = linking.s2_keys(papers, num_buckets)
    matches = linking.match_keys(keys, works, num_buckets)
    return linking.assemble_papers(papers, abstracts, matches)


def changed_citations(records: pa.Table, current: pa.Table, recovered: pa.Table) -> pa.Table:
    """Rows of the `citations` table for citation records; a citing sentence S2ORC recovered
    for a pair stays when the new record has none of its own."""
    rows = linking.assemble_citations(records, recovered)
    return duck.query(
        """SELECT n.citing_id, n.cited_id,
            CASE WHEN n.context_source IS NULL AND c.context_source = 's2orc'
                 THEN c.contexts ELSE n.contexts END AS contexts,
            CASE WHEN n.context_source IS NULL AND c.context_source = 's2orc'
                 THEN 's2orc' ELSE n.context_source END AS context_source,
            n.intents, n.is_influential
        FROM rows n LEFT JOIN cur c USING (citing_id, cited_id)""",
        rows=rows,
        cur=current,
    ).cast(rows.schema)


def field_count_delta(before: pa.Table, after: pa.Table) -> pa.Table:
    """What rewriting papers from rows `before` to rows `after` (a deleted paper has no row
    after) changes in the papers per venue and field: the venues table's counts, kept by a
    refresh instead of recounted."""
    return duck.query(
        """SELECT venue_id, field_id, sum(d)::BIGINT AS n FROM (
            SELECT venue_id, field_id, 1 AS d FROM after
            UNION ALL SELECT venue_id, field_id, -1 AS d FROM before)
        GROUP BY ALL HAVING sum(d) <> 0""",
        before=before.select(["venue_id", "field_id"]),
        after=after.select(["venue_id", "field_id"]),
    )
