"""Parsing raw bulk-export lines into typed rows, with every bad line quarantined and explained.

Each dataset is described once (`RecordSpec`): how to pull typed fields out of a JSON object,
which checks make a line a reject, which valid rows are dropped by rule (an unresolved
reference), and which key places a row in its join bucket. `parse_lines` turns a batch of raw
lines into one Arrow table with a `_bucket` column: a bucket number for good rows, `REJECTED`
for quarantined lines (raw text and reason kept), `SKIPPED` for valid rows dropped by rule
(counted, not kept). The work happens in DuckDB, vectorised over the batch.

Identifiers are read strictly: a JSON integer or a string of decimal digits (S2), or the id URL
of the right kind (OpenAlex `https://openalex.org/W…`). Anything else — `1579548549.6`, `6.0`,
`"1e3"`, `"0x1F"` — is a reject with a reason, never a rounded or different id, because a wrong id
attaches citations and topics to the wrong paper. List fields (contexts, intents, topics) must be
lists of the right element type; a string where a list belongs is a reject, not an empty list.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from cpr_ray.tables import duckdb_sql as duck
from cpr_ray.tables.buckets import BUCKET, REJECTED, SKIPPED


def _int_id(path: str) -> str:
    """SQL: the id at `path` of `j` when it is written as decimal digits, a JSON integer or a
    string; `1.5`, `7.0`, `1e3` (read back as `1000.0`), `"0x1F"` and `-5` give NULL."""
    return f"TRY_CAST(nullif(regexp_extract(j->>'{path}', '^\\s*(\\d+)\\s*$', 1), '') AS BIGINT)"


def _url_id(text: str, letter: str = "") -> str:
    """SQL: the number of an id written as digits or as a URL ending in `/{letter}digits`
    (`https://openalex.org/W123`, `https://pubmed.ncbi.nlm.nih.gov/31415`); NULL otherwise."""
    prefix = f"[{letter.upper()}{letter.lower()}]" if letter else ""
    return (
        f"TRY_CAST(nullif(regexp_extract(CAST({text} AS VARCHAR), "
        f"'^\\s*(?:https?://\\S*/)?{prefix}(\\d+)\\s*$', 1), '') AS BIGINT)"
    )


_STRINGS = """('["VARCHAR"]', '["NULL"]')"""  # what json_structure says of a list of strings


def _structure(path: str) -> str:
    """SQL: the JSON structure at `path` (`["VARCHAR"]` for a list of strings), for the
    `*_raw` column that `_str_list` reads and `_not_str_list` checks."""
    return f"json_structure(j->'{path}')"


def _str_list(col: str, path: str) -> str:
    """SQL: the list of strings at `path`; NULL when absent, JSON null, or not a list of strings
    (a string, a list of numbers or of lists), as `{col}_raw` (its structure) tells."""
    return f"CASE WHEN {col}_raw IN {_STRINGS} THEN CAST(j->'{path}' AS VARCHAR[]) END"


def _not_str_list(col: str, reason: str) -> tuple[str, str]:
    """A check: the value is there, not JSON null, and not a list of strings."""
    return (f"{col}_raw <> '\"NULL\"' AND {col}_raw NOT IN {_STRINGS}", reason)


def _timestamp(path: str) -> str:
    """SQL: `updated` orders versions of one record (the newest wins), so it is a timestamp."""
    return f"TRY_CAST(j->>'{path}' AS TIMESTAMP)"


def _present(path: str) -> str:
    """SQL: the key at `path` is there and not JSON null."""
    return f"coalesce(json_type(j, '{path}'), 'NULL') <> 'NULL'"


def _bad_when_present(col: str, path: str, reason: str) -> tuple[str, str]:
    """A check: the value at `path` is there but `col` could not be read from it."""
    return (f"{_present(path)} AND {col} IS NULL", reason)


TOPICS_JSON = (
    '[{"id":"VARCHAR","display_name":"VARCHAR","score":"DOUBLE",'
    '"subfield":{"id":"VARCHAR","display_name":"VARCHAR"},'
    '"field":{"id":"VARCHAR","display_name":"VARCHAR"},'
    '"domain":{"id":"VARCHAR","display_name":"VARCHAR"}}]'
)

# OpenAlex hierarchy ids come as URLs in works (https://openalex.org/fields/17): keep the number.
# A topic that is not an object, or whose ids do not read as ids, leaves a NULL id behind, which
# `TOPICS_OK` turns into a reject (a list of strings would otherwise become all-null structs).
TOPICS_SQL = f"""CASE WHEN json_type(j, '$.topics') = 'ARRAY' THEN list_transform(
    json_transform(j->'$.topics', '{TOPICS_JSON}'),
    lambda t: {{'id': {_url_id("t.id", "T")}::INTEGER, 'name': t.display_name,
               'score': t.score::FLOAT,
               'subfield_id': {_url_id("t.subfield.id")}::INTEGER,
               'subfield': t.subfield.display_name,
               'field_id': {_url_id("t.field.id")}::INTEGER, 'field': t.field.display_name,
               'domain_id': {_url_id("t.domain.id")}::INTEGER,
               'domain': t.domain.display_name}}) END"""
TOPICS_OK = """coalesce(list_bool_and(list_transform(topics, lambda t:
    t.id IS NOT NULL AND t.subfield_id IS NOT NULL AND t.field_id IS NOT NULL
    AND t.domain_id IS NOT NULL)), true)"""


@dataclass(frozen=True)
class RecordSpec:
    """How one bulk dataset's JSON lines become typed rows."""

    name: str
    # output column -> SQL expression over the JSON object `j` (and earlier columns); `*_raw`
    # columns only serve the checks and are not output
    fields: dict[str, str]
    checks: tuple[tuple[str, str], ...]  # (SQL condition over the fields, reject reason), in order
    bucket_key: str  # SQL expression over the fields: int key, or string key (hashed)
    skip_when: str = "false"  # valid rows dropped by rule; counted in the SKIPPED bucket
    string_key: bool = False


def _id_fields(col: str, source: str) -> dict[str, str]:
    """An integer id column and its raw text (kept for `_id_checks`' reasons)."""
    return {f"{col}_raw": f"j->>'$.{source}'", col: _int_id(f"$.{source}")}


def _id_checks(col: str, source: str) -> tuple[tuple[str, str], ...]:
    return (
        (f"{col}_raw IS NULL", f"missing_{source}"),
        (f"{col} IS NULL OR {col} < 0", f"bad_{source}"),
    )


S2_PAPERS = RecordSpec(
    name="papers",
    fields={
        **_id_fields("corpus_id", "corpusid"),
        "title": "j->>'$.title'",
        "venue": "nullif(trim(j->>'$.venue'), '')",
        "venue_id": "j->>'$.publicationvenueid'",
        "year": "TRY_CAST(j->>'$.year' AS INTEGER)",
        "publication_date": "TRY_CAST(j->>'$.publicationdate' AS DATE)",
        "doi": "norm_doi(j->>'$.externalids.DOI')",
        "mag_id": _url_id("j->>'$.externalids.MAG'"),
        "pmid": _url_id("j->>'$.externalids.PubMed'"),
        "arxiv_id": "j->>'$.externalids.ArXiv'",
        "updated": _timestamp("$.updated"),
    },
    checks=(
        *_id_checks("corpus_id", "corpusid"),
        _bad_when_present("mag_id", "$.externalids.MAG", "bad_mag_id"),
        _bad_when_present("pmid", "$.externalids.PubMed", "bad_pmid"),
        _bad_when_present("updated", "$.updated", "bad_updated"),
    ),
    bucket_key="corpus_id",
)

S2_ABSTRACTS = RecordSpec(
    name="abstracts",
    fields={
        **_id_fields("corpus_id", "corpusid"),
        "abstract": "nullif(trim(j->>'$.abstract'), '')",
        "license": "j->>'$.openaccessinfo.license'",
        "updated": _timestamp("$.updated"),
    },
    checks=(
        *_id_checks("corpus_id", "corpusid"),
        _bad_when_present("updated", "$.updated", "bad_updated"),
    ),
    bucket_key="corpus_id",
    skip_when="abstract IS NULL",
)

S2_CITATIONS = RecordSpec(
    name="citations",
    fields={
        **_id_fields("citing_id", "citingcorpusid"),
        **_id_fields("cited_id", "citedcorpusid"),
        "contexts_raw": _structure("$.contexts"),
        "contexts": _str_list("contexts", "$.contexts"),
        "intents_raw": _structure("$.intents"),
        "intents": _str_list("intents", "$.intents"),
        "is_influential": "TRY_CAST(j->>'$.isinfluential' AS BOOLEAN)",
        "updated": _timestamp("$.updated"),
    },
    checks=(
        *_id_checks("citing_id", "citingcorpusid"),
        ("cited_id_raw IS NOT NULL AND (cited_id IS NULL OR cited_id < 0)", "bad_citedcorpusid"),
        _not_str_list("contexts", "bad_contexts"),
        _not_str_list("intents", "bad_intents"),
        _bad_when_present("updated", "$.updated", "bad_updated"),
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
        "alternate_issns_raw": _structure("$.alternate_issns"),
        "alternate_issns": _str_list("alternate_issns", "$.alternate_issns"),
    },
    checks=(
        ("venue_id IS NULL OR venue_id = ''", "missing_id"),
        _not_str_list("alternate_issns", "bad_alternate_issns"),
    ),
    bucket_key="0",
)

S2ORC = RecordSpec(
    name="s2orc",
    fields={
        **_id_fields("corpus_id", "corpusid"),
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
        "work_id": _url_id("j->>'$.id'", "W"),
        "doi": "norm_doi(j->>'$.doi')",
        "mag_id": _url_id("j->>'$.ids.mag'"),
        "pmid": _url_id("j->>'$.ids.pmid'"),
        "publication_date": "TRY_CAST(j->>'$.publication_date' AS DATE)",
        "source_id": _url_id("j->>'$.primary_location.source.id'", "S"),
        "license": "coalesce(j->>'$.primary_location.license', j->>'$.best_oa_location.license')",
        "topics": TOPICS_SQL,
        "inverted_index": "j->'$.abstract_inverted_index'",
        "updated": _timestamp("$.updated_date"),
    },
    checks=(
        ("work_id_raw IS NULL", "missing_id"),
        ("work_id IS NULL", "bad_id"),
        _bad_when_present("mag_id", "$.ids.mag", "bad_mag_id"),
        _bad_when_present("pmid", "$.ids.pmid", "bad_pmid"),
        _bad_when_present("source_id", "$.primary_location.source.id", "bad_source_id"),
        (f"{_present('$.topics')} AND (topics IS NULL OR NOT {TOPICS_OK})", "bad_topics"),
        _bad_when_present("updated", "$.updated_date", "bad_updated"),
    ),
    bucket_key="work_id",
)

OPENALEX_SOURCES = RecordSpec(
    name="sources",
    fields={
        "source_id_raw": "j->>'$.id'",
        "source_id": _url_id("j->>'$.id'", "S"),
        "display_name": "j->>'$.display_name'",
        "type": "j->>'$.type'",
        "issn_l": "upper(j->>'$.issn_l')",
        "issn_raw": _structure("$.issn"),
        "issn": f"list_transform({_str_list('issn', '$.issn')}, lambda s: upper(s))",
        "two_year_mean_citedness": (
            "TRY_CAST(j->>'$.summary_stats.\"2yr_mean_citedness\"' AS DOUBLE)"
        ),
        "h_index": "TRY_CAST(j->>'$.summary_stats.h_index' AS INTEGER)",
        "updated": _timestamp("$.updated_date"),
    },
    checks=(
        ("source_id_raw IS NULL", "missing_id"),
        ("source_id IS NULL", "bad_id"),
        _not_str_list("issn", "bad_issn"),
        _bad_when_present("updated", "$.updated_date", "bad_updated"),
    ),
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
    SELECT text AS raw, path, reject AS read_reject,
           CASE WHEN reject IS NULL AND json_valid(text) THEN text::JSON END AS j0
    FROM lines WHERE reject IS NOT NULL OR trim(text) <> ''
), doc AS (
    SELECT raw, path, read_reject, j0 IS NULL AS bad_json,
           CASE WHEN j0 IS NOT NULL AND json_type(j0) = 'OBJECT' THEN j0 END AS j
    FROM src
), rec AS (
    SELECT raw, path, read_reject, bad_json, j, j IS NULL AS not_object,
    {fields}
    FROM doc
), chk AS (
    SELECT *, CASE
        WHEN read_reject IS NOT NULL THEN read_reject
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
    """Parse a batch of raw lines into typed, bucketed rows.

    `lines` has `text` and `path` columns, and may have `reject`: a reason the shard reader
    already gave the line (not UTF-8, or the marker of a quarantined shard), kept as is.
    """
    if "reject" not in lines.column_names:
        lines = lines.append_column("reject", pa.nulls(lines.num_rows, pa.string()))
    return duck.query(parse_sql(spec, num_buckets, raw_limit), threads, lines=lines)
