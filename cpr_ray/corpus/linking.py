"""Linking Semantic Scholar papers to OpenAlex works, and assembling the corpus tables.

Pure functions over Arrow tables (DuckDB inside), one per step of the bucketed join, so each
is testable on a handful of rows without Ray:

1. `s2_keys` / `work_keys`: every identifier becomes a key row (`doi:…`, `mag:…`, `pmid:…`) with
   its priority, hashed into key buckets; works carry their payload (topics, source, abstract).
2. `match_keys`: per key bucket, S2 key rows meet OpenAlex key rows → candidate matches, re-bucketed
   by corpus id.
3. `assemble_papers`: per corpus-id bucket, the best match (DOI before MAG before PubMed) and the
   abstract are attached to the newest version of each paper.
4. `assemble_citations`: per citing-id bucket, citations get S2ORC sentences when S2 has none.
5. `assemble_venues`: S2 venues ↔ OpenAlex sources by ISSN, with impact and home field.

Duplicates — records with the same key, as bulk exports and snapshot partitions carry them — are
resolved by one rule everywhere (`NEWEST_FIRST`): the newest `updated` wins (a record without one
loses to any that has one); between equal timestamps, the row with the smaller content hash, so
the same inputs give the same row whatever order shards are read in and however they are
bucketed. Between citations of equal timestamps, the copy with more citing sentences comes
first. `duplicates` counts what the rule drops, for the stage summary.
"""

from __future__ import annotations

import pyarrow as pa

from cpr_ray.corpus.taxonomy import DOMAINS, FIELDS
from cpr_ray.tables import duckdb_sql as duck
from cpr_ray.tables import schemas
from cpr_ray.tables.buckets import BUCKET, REJECTED, SKIPPED

KEY_PRIORITY = {"doi": 0, "mag": 1, "pmid": 2}

# ORDER BY of the window that keeps one row per key: newest first, then a stable tie-break on the
# row's content (`{t}` is the table), independent of read order
NEWEST_FIRST = "updated DESC NULLS LAST, hash({t})"

CITATIONS_FIRST = "updated DESC NULLS LAST, len(coalesce(contexts, [])) DESC, hash(citations)"

_KEYS = " UNION ALL ".join(
    f"SELECT '{name}:' || CAST({col} AS VARCHAR) AS key, '{name}' AS key_type, {prio} AS prio, * "
    f"FROM {{src}} WHERE {col} IS NOT NULL"
    for name, col, prio in (("doi", "doi", 0), ("mag", "mag_id", 1), ("pmid", "pmid", 2))
)

# Licences are spelled differently by S2 ("CCBY") and OpenAlex ("cc-by"): compare one spelling.
_LICENSE = """CASE WHEN {x} IS NULL THEN NULL
    WHEN upper(regexp_replace({x}, '[^A-Za-z0-9]', '', 'g')) IN ('PUBLICDOMAIN', 'PD') THEN 'PD'
    ELSE nullif(upper(regexp_replace({x}, '[^A-Za-z0-9]', '', 'g')), '') END"""


# what makes two rows of each parsed input the same record (works: counted on each work's
# primary key row only, since a work has a row per key): key columns, and a flag column or None
DEDUP_KEYS: dict[str, tuple[tuple[str, ...], str | None]] = {
    "papers": (("corpus_id",), None),
    "abstracts": (("corpus_id",), None),
    "citations": (("citing_id", "cited_id"), None),
    "works": (("key", "work_id"), "primary_key"),
    "publication-venues": (("venue_id",), None),
    "sources": (("source_id",), None),
}


def dedup_columns(name: str) -> list[str]:
    """The columns `duplicates` reads for input `name`."""
    keys, flag = DEDUP_KEYS[name]
    return [*keys, *([flag] if flag else [])]


def duplicates(name: str, rows: pa.Table, threads: int = 1) -> int:
    """How many rows of one bucket of input `name` the newest-first rule drops."""
    keys, flag = DEDUP_KEYS[name]
    sql = f"""SELECT count(*) - count(DISTINCT row({", ".join(keys)})) AS n
        FROM rows WHERE {flag or "true"}"""
    return int(duck.query(sql, threads, rows=rows)["n"][0].as_py())


def s2_keys(papers: pa.Table, num_buckets: int, threads: int = 1) -> pa.Table:
    """Parsed S2 paper rows → (key, key_type, prio, corpus_id, _bucket) rows."""
    sql = f"""
    SELECT key, key_type, prio, corpus_id, CAST(hash(key) % {num_buckets} AS INTEGER) AS {BUCKET}
    FROM ({_KEYS.format(src="papers")})"""
    return duck.query(sql, threads, papers=papers)


def work_keys(parsed: pa.Table, num_buckets: int, threads: int = 1) -> pa.Table:
    """Parsed OpenAlex work rows → key rows with payload, plus the parser's rejects as they are.

    The abstract is rebuilt from OpenAlex's inverted index (word → positions) here, in SQL.
    Works with no DOI, MAG or PubMed id can never link and go to the skipped partition.
    `primary_key` marks each work's best key row: one per work, for counting duplicate works.
    """
    sql = f"""
    WITH w AS (
        SELECT *, row_number() OVER () AS rid FROM parsed WHERE {BUCKET} >= 0
    ), entries AS (
        SELECT rid, unnest(map_entries(
            TRY_CAST(inverted_index::JSON AS MAP(VARCHAR, INTEGER[])))) AS kv
        FROM w WHERE inverted_index IS NOT NULL
    ), words AS (
        SELECT rid, kv.key AS word, unnest(kv.value) AS pos FROM entries
    ), abstracts AS (
        SELECT rid, string_agg(word, ' ' ORDER BY pos) AS abstract FROM words GROUP BY rid
    ), payload AS (
        SELECT w.rid, w.work_id, w.doi, w.mag_id, w.pmid, w.publication_date, w.source_id,
               w.license, w.topics, w.updated, a.abstract
        FROM w LEFT JOIN abstracts a USING (rid)
    ), keyed AS ({_KEYS.format(src="payload")})
    SELECT key, key_type, prio, work_id, publication_date, source_id, license, topics, updated,
           abstract, prio = min(prio) OVER (PARTITION BY rid) AS primary_key,
           CAST(hash(key) % {num_buckets} AS INTEGER) AS {BUCKET},
           NULL::VARCHAR AS reject_reason, NULL::VARCHAR AS raw, NULL::VARCHAR AS path
    FROM keyed
    UNION ALL BY NAME
    SELECT work_id, {SKIPPED}::INTEGER AS {BUCKET} FROM payload
    WHERE doi IS NULL AND mag_id IS NULL AND pmid IS NULL
    UNION ALL BY NAME
    SELECT {REJECTED}::INTEGER AS {BUCKET}, reject_reason, raw, path
    FROM parsed WHERE {BUCKET} = {REJECTED}
    """
    return duck.query(sql, threads, parsed=parsed)


def match_keys(s2: pa.Table, works: pa.Table, num_buckets: int, threads: int = 1) -> pa.Table:
    """One key bucket: S2 keys joined to OpenAlex keys, re-bucketed by corpus id.

    A work seen in several snapshot partitions counts once (its newest version).
    """
    sql = f"""
    WITH o AS (
        SELECT * FROM works
        QUALIFY row_number() OVER (
            PARTITION BY key, work_id ORDER BY {NEWEST_FIRST.format(t="works")}) = 1
    )
    SELECT s.corpus_id, s.key_type, s.prio, o.work_id, o.publication_date, o.source_id,
           o.license, o.topics, o.abstract,
           CAST(s.corpus_id % {num_buckets} AS INTEGER) AS {BUCKET}
    FROM s2 s JOIN o USING (key)
    """
    return duck.query(sql, threads, s2=s2, works=works)


def assemble_papers(
    papers: pa.Table, abstracts: pa.Table, matches: pa.Table, threads: int = 1
) -> pa.Table:
    """One corpus-id bucket → rows of the `papers` table (schema `schemas.PAPERS`)."""
    sql = f"""
    WITH p AS (
        SELECT * FROM papers
        QUALIFY row_number() OVER (
            PARTITION BY corpus_id ORDER BY {NEWEST_FIRST.format(t="papers")}) = 1
    ), a AS (
        SELECT * FROM abstracts
        QUALIFY row_number() OVER (
            PARTITION BY corpus_id ORDER BY {NEWEST_FIRST.format(t="abstracts")}) = 1
    ), m AS (
        SELECT * FROM matches
        QUALIFY row_number() OVER (PARTITION BY corpus_id ORDER BY prio, work_id) = 1
    )
    SELECT p.corpus_id, p.title,
        coalesce(a.abstract, m.abstract) AS abstract,
        CASE WHEN a.abstract IS NOT NULL THEN {_LICENSE.format(x="a.license")}
             WHEN m.abstract IS NOT NULL THEN {_LICENSE.format(x="m.license")} END
            AS abstract_license,
        CASE WHEN a.abstract IS NOT NULL THEN 's2'
             WHEN m.abstract IS NOT NULL THEN 'openalex' END AS abstract_source,
        coalesce(length(coalesce(a.abstract, m.abstract)), 0) AS abstract_length,
        coalesce(p.year, year(m.publication_date)) AS year,
        coalesce(p.publication_date, m.publication_date) AS publication_date,
        p.venue, p.venue_id, p.doi, p.mag_id, p.pmid, p.arxiv_id,
        m.work_id AS openalex_id, m.source_id AS openalex_source_id, m.key_type AS join_key,
        m.topics,
        m.topics[1].field_id AS field_id, m.topics[1].field AS field,
        m.topics[1].domain_id AS domain_id, m.topics[1].domain AS domain
    FROM p LEFT JOIN a USING (corpus_id) LEFT JOIN m USING (corpus_id)
    """
    return duck.query(sql, threads, papers=papers, abstracts=abstracts, matches=matches).cast(
        schemas.PAPERS
    )


def assemble_citations(citations: pa.Table, recovered: pa.Table, threads: int = 1) -> pa.Table:
    """One citing-id bucket → rows of the `citations` table (schema `schemas.CITATIONS`).

    S2's own contexts win; S2ORC sentences fill in only where S2 has none.
    """
    sql = f"""
    WITH c AS (
        SELECT * FROM citations
        QUALIFY row_number() OVER (
            PARTITION BY citing_id, cited_id ORDER BY {CITATIONS_FIRST}) = 1
    ), r AS (
        SELECT citing_id, cited_id, flatten(list(sentences)) AS sentences
        FROM recovered GROUP BY citing_id, cited_id
    )
    SELECT c.citing_id, c.cited_id,
        CASE WHEN len(c.contexts) > 0 THEN c.contexts
             WHEN len(r.sentences) > 0 THEN r.sentences ELSE [] END AS contexts,
        CASE WHEN len(c.contexts) > 0 THEN 's2'
             WHEN len(r.sentences) > 0 THEN 's2orc' END AS context_source,
        coalesce(c.intents, []) AS intents,
        coalesce(c.is_influential, false) AS is_influential
    FROM c LEFT JOIN r USING (citing_id, cited_id)
    """
    return duck.query(sql, threads, citations=citations, recovered=recovered).cast(
        schemas.CITATIONS
    )


def _taxonomy_table() -> pa.Table:
    ids = sorted(FIELDS)
    return pa.table(
        {
            "field_id": pa.array(ids, pa.int32()),
            "field": [FIELDS[i][0] for i in ids],
            "domain_id": pa.array([FIELDS[i][1] for i in ids], pa.int32()),
            "domain": [DOMAINS[FIELDS[i][1]] for i in ids],
        }
    )


def assemble_venues(
    venues: pa.Table, sources: pa.Table, field_counts: pa.Table, threads: int = 1
) -> pa.Table:
    """S2 venues with their OpenAlex source (matched by any ISSN), impact and home field.

    `field_counts` holds (venue_id, field_id, n) over the papers table; a venue's field is the
    one most of its papers belong to, and `field_share` says how clearly.
    """
    sql = f"""
    WITH v AS (
        SELECT * FROM venues
        QUALIFY row_number() OVER (PARTITION BY venue_id ORDER BY hash(venues)) = 1
    ), v_issn AS (
        SELECT venue_id, unnest(list_distinct(list_filter(
            [issn] || coalesce(alternate_issns, []), lambda x: x IS NOT NULL))) AS issn FROM v
    ), s AS (
        SELECT * FROM sources
        QUALIFY row_number() OVER (
            PARTITION BY source_id ORDER BY {NEWEST_FIRST.format(t="sources")}) = 1
    ), s_issn AS (
        SELECT source_id, unnest(list_distinct(list_filter(
            [issn_l] || coalesce(issn, []), lambda x: x IS NOT NULL))) AS issn FROM s
    ), link AS (
        SELECT venue_id, min(source_id) AS source_id
        FROM v_issn JOIN s_issn ON upper(v_issn.issn) = s_issn.issn GROUP BY venue_id
    ), totals AS (
        SELECT venue_id, sum(n) AS total FROM field_counts GROUP BY venue_id
    ), top AS (
        SELECT venue_id, field_id, n FROM field_counts WHERE field_id IS NOT NULL
        QUALIFY row_number() OVER (PARTITION BY venue_id ORDER BY n DESC, field_id) = 1
    )
    SELECT v.venue_id, v.name, coalesce(v.type, s.type) AS type, v.issn,
        s.source_id AS openalex_source_id, s.two_year_mean_citedness, s.h_index,
        coalesce(totals.total, 0) AS n_papers,
        top.field_id, tax.field, tax.domain_id, tax.domain,
        top.n / totals.total AS field_share
    FROM v
    LEFT JOIN link USING (venue_id)
    LEFT JOIN s ON s.source_id = link.source_id
    LEFT JOIN totals ON totals.venue_id = v.venue_id
    LEFT JOIN top ON top.venue_id = v.venue_id
    LEFT JOIN taxonomy tax ON tax.field_id = top.field_id
    ORDER BY v.venue_id
    """
    return duck.query(
        sql,
        threads,
        venues=venues,
        sources=sources,
        field_counts=field_counts,
        taxonomy=_taxonomy_table(),
    ).cast(schemas.VENUES)
