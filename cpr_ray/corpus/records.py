"""Parsing raw bulk-export lines into typed rows, with every bad line quarantined and explained.

Each dataset is described once (`RecordSpec`): how to pull typed fields out of a JSON object,
which checks make a line a reject, which valid rows are dropped by rule (an unresolved
reference), and which key places a row in its join bucket. `parse_lines` turns a batch of raw
lines into one Arrow table with a `_bucket` column: a bucket number for good rows, `REJECTED`
for quarantined lines (raw text and reason kept), `SKIPPED` for valid rows dropped by rule
(counted, not kept). The work happens in DuckDB, vectorised over the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from cpr_ray import duck
from cpr_ray.buckets import BUCKET, REJECTED, SKIPPED

TOPICS_JSON = (
    '[{"id":"VARCHAR","display_name":"VARCHAR","score":"DOUBLE",'
    '"subfield":{"id":"VARCHAR","display_name":"VARCHAR"},'
    '"field":{"id":"VARCHAR","display_name":"VARCHAR"},'
    '"domain":{"id":"VARCHAR","display_name":"VARCHAR"}}]'
)

# OpenAlex hierarchy ids come as URLs in works (https://openalex.org/fields/17): keep the number.
TOPICS_SQL = f"""list_transform(
    json_transform(j->'$.topics', '{TOPICS_JSON}'),
    lambda t: {{'id': trailing_int(t.id)::INTEGER, 'name': t.display_name,
               'score': t.score::FLOAT,
               'subfield_id': trailing_int(t.subfield.id)::INTEGER,
               'subfield': t.subfield.display_name,
               'field_id': trailing_int(t.field.id)::INTEGER, 'field': t.field.display_name,
               'domain_id': trailing_int(t.domain.id)::INTEGER,
               'domain': t.domain.display_name}})"""


@dataclass(frozen=True)
class RecordSpec:
    """How one bulk dataset's JSON lines become typed rows."""

    name: str
    fields: dict[str, str]  # output column -> SQL expression over the JSON object `j`
    checks: tuple[tuple[str, str], ...]  # (SQL condition over the fields, reject reason), in order
    bucket_key: str  # SQL expression over the fields: int key, or string key (hashed)
    skip_when: str = "false"  # valid rows dropped by rule; counted in the SKIPPED bucket
    string_key: bool = False


def _id_checks(col: str, source: str) -> tuple[tuple[str, str], ...]:
    return (
        (f"{col}_raw IS NULL", f"missing_{source}"),
        (f"{col} IS NULL OR {col} < 0", f"bad_{source}"),
    )


S2_PAPERS = RecordSpec(
    name="papers",
    fields={
        "corpus_id_raw": "j->>'$.corpusid'",
        "corpus_id": "TRY_CAST(j->>'$.corpusid' AS BIGINT)",
        "title": "j->>'$.title'",
        "venue": "nullif(trim(j->>'$.venue'), '')",
        "venue_id": "j->>'$.publicationvenueid'",
        "year": "TRY_CAST(j->>'$.year' AS INTEGER)",
        "publication_date": "TRY_CAST(j->>'$.publicationdate' AS DATE)",
        "doi": "norm_doi(j->>'$.externalids.DOI')",
        "mag_id": "trailing_int(j->>'$.externalids.MAG')",
        "pmid": "trailing_int(j->>'$.externalids.PubMed')",
        "arxiv_id": "j->>'$.externalids.ArXiv'",
        "updated": "j->>'$.updated'",
    },
    checks=_id_checks("corpus_id", "corpusid"),
    bucket_key="corpus_id",
)

S2_ABSTRACTS = RecordSpec(
    name="abstracts",
    fields={
        "corpus_id_raw": "j->>'$.corpusid'",
        "corpus_id": "TRY_CAST(j->>'$.corpusid' AS BIGINT)",
        "abstract": "nullif(trim(j->>'$.abstract'), '')",
        "license": "j->>'$.openaccessinfo.license'",
        "updated": "j->>'$.updated'",
    },
    checks=_id_checks("corpus_id", "corpusid"),
    bucket_key="corpus_id",
    skip_when="abstract IS NULL",
)

S2_CITATIONS = RecordSpec(
    name="citations",
    fields={
        "citing_id_raw": "j->>'$.citingcorpusid'",
        "citing_id": "TRY_CAST(j->>'$.citingcorpusid' AS BIGINT)",
        "cited_id_raw": "j->>'$.citedcorpusid'",
        "cited_id": "TRY_CAST(j->>'$.citedcorpusid' AS BIGINT)",
        "contexts": "TRY_CAST(j->'$.contexts' AS VARCHAR[])",
        "intents": "TRY_CAST(j->'$.intents' AS VARCHAR[])",
        "is_influential": "TRY_CAST(j->>'$.isinfluential' AS BOOLEAN)",
    },
    checks=(
        *_id_checks("citing_id", "citingcorpusid"),
        ("cited_id_raw IS NOT NULL AND cited_id IS NULL", "bad_citedcorpusid"),
    ),
    bucket_key="citing_id",
    # S2 keeps references it could not resolve to a paper; they can never become a pair
    skip_when="cited_id IS NULL",
)

S2_VENUES = RecordSpec(
    name="publication-venues",
    fields={
        "venue_id": "j->>'$.id'",
        "name": "j->>'$.name'",
        "type": "j->>'$.type'",
        "issn": "nullif(upper(trim(j->>'$.issn')), '')",
        "alternate_issns": "TRY_CAST(j->'$.alternate_issns' AS VARCHAR[])",
    },
    checks=(("venue_id IS NULL OR venue_id = ''", "missing_id"),),
    bucket_key="0",
)

S2ORC = RecordSpec(
    name="s2orc",
    fields={
        "corpus_id_raw": "j->>'$.corpusid'",
        "corpus_id": "TRY_CAST(j->>'$.corpusid' AS BIGINT)",
        "text": "j->>'$.content.text'",
        "bibref": "j->>'$.content.annotations.bibref'",
        "bibentry": "j->>'$.content.annotations.bibentry'",
    },
    checks=_id_checks("corpus_id", "corpusid"),
    bucket_key="corpus_id",
    skip_when="text IS NULL OR bibref IS NULL OR bibentry IS NULL",
)

OPENALEX_WORKS = RecordSpec(
    name="works",
    fields={
        "work_id_raw": "j->>'$.id'",
        "work_id": "trailing_int(j->>'$.id')",
        "doi": "norm_doi(j->>'$.doi')",
        "mag_id": "trailing_int(j->>'$.ids.mag')",
        "pmid": "trailing_int(j->>'$.ids.pmid')",
        "publication_date": "TRY_CAST(j->>'$.publication_date' AS DATE)",
        "source_id": "trailing_int(j->>'$.primary_location.source.id')",
        "license": "coalesce(j->>'$.primary_location.license', j->>'$.best_oa_location.license')",
        "topics": TOPICS_SQL,
        "inverted_index": "j->'$.abstract_inverted_index'",
        "updated": "j->>'$.updated_date'",
    },
    checks=(
        ("work_id_raw IS NULL", "missing_id"),
        ("work_id IS NULL", "bad_id"),
        ("(j->'$.topics') IS NOT NULL AND topics IS NULL", "bad_topics"),
    ),
    bucket_key="work_id",
)

OPENALEX_SOURCES = RecordSpec(
    name="sources",
    fields={
        "source_id_raw": "j->>'$.id'",
        "source_id": "trailing_int(j->>'$.id')",
        "display_name": "j->>'$.display_name'",
        "type": "j->>'$.type'",
        "issn_l": "upper(j->>'$.issn_l')",
        "issn": "list_transform(TRY_CAST(j->'$.issn' AS VARCHAR[]), lambda s: upper(s))",
        "two_year_mean_citedness": (
            "TRY_CAST(j->>'$.summary_stats.\"2yr_mean_citedness\"' AS DOUBLE)"
        ),
        "h_index": "TRY_CAST(j->>'$.summary_stats.h_index' AS INTEGER)",
    },
    checks=(("source_id_raw IS NULL", "missing_id"), ("source_id IS NULL", "bad_id")),
    bucket_key="0",
)

SPECS: dict[str, RecordSpec] = {
    s.name: s
    for s in (
        S2_PAPERS,
        S2_ABSTRACTS,
        S2_CITATIONS,
        S2_VENUES,
        S2ORC,
        OPENALEX_WORKS,
        OPENALEX_SOURCES,
    )
}


def parse_sql(spec: RecordSpec, num_buckets: int, raw_limit: int) -> str:
    fields = ",\n    ".join(f"{expr} AS {col}" for col, expr in spec.fields.items())
    checks = "\n        ".join(f"WHEN {cond} THEN '{reason}'" for cond, reason in spec.checks)
    bucket = f"hash({spec.bucket_key})" if spec.string_key else f"({spec.bucket_key})"
    out_cols = ", ".join(c for c in spec.fields if not c.endswith("_raw"))
    return f"""
WITH src AS (
    SELECT text AS raw, path, CASE WHEN json_valid(text) THEN text::JSON END AS j0
    FROM lines WHERE trim(text) <> ''
), doc AS (
    SELECT raw, path, j0 IS NULL AS bad_json,
           CASE WHEN j0 IS NOT NULL AND json_type(j0) = 'OBJECT' THEN j0 END AS j
    FROM src
), rec AS (
    SELECT raw, path, bad_json, j, j IS NULL AS not_object,
    {fields}
    FROM doc
), chk AS (
    SELECT *, CASE
        WHEN bad_json THEN 'malformed_json'
        WHEN not_object THEN 'not_a_json_object'
        {checks}
        END AS reject_reason
    FROM rec
)
SELECT {out_cols},
    CAST(CASE WHEN reject_reason IS NOT NULL THEN {REJECTED}
              WHEN {spec.skip_when} THEN {SKIPPED}
              ELSE {bucket} % {num_buckets} END AS INTEGER) AS {BUCKET},
    reject_reason,
    CASE WHEN reject_reason IS NOT NULL THEN left(raw, {raw_limit}) END AS raw,
    CASE WHEN reject_reason IS NOT NULL THEN path END AS path
FROM chk
"""


def parse_lines(
    lines: pa.Table, spec: RecordSpec, num_buckets: int, raw_limit: int = 20_000, threads: int = 1
) -> pa.Table:
    """Parse a batch of raw lines (`text`, `path` columns) into typed, bucketed rows."""
    return duck.query(parse_sql(spec, num_buckets, raw_limit), threads, lines=lines)
