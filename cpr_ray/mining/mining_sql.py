"""The SQL and columns of mining's passes (`mining_stages`), shared by the full path and the
refresh's path over the rows its changes reach (`mine_incremental`), so that both compute a row
with the same query."""

from __future__ import annotations

import pyarrow as pa

PAPER_COLUMNS = [
    "corpus_id",
    "venue_id",
    "year",
    "publication_date",
    "abstract_length",
    "topics",
    "field_id",
    "field",
    "domain_id",
    "domain",
]

# the citations of top-venue papers: what puts a cited paper in the pooling universe
TOP_CITES_SQL = """
SELECT c.citing_id, c.cited_id FROM citations c
JOIN papers p ON p.corpus_id = c.citing_id JOIN top t ON t.venue_id = p.venue_id
"""
UNIVERSE_IDS_SQL = """
SELECT DISTINCT id, CAST(id % {n} AS INTEGER) AS _bucket FROM (
    SELECT p.corpus_id AS id FROM papers p JOIN top t ON t.venue_id = p.venue_id
    UNION ALL
    SELECT cited_id FROM top_cites
)
"""

CANDIDATE_SQL = """
SELECT c.citing_id AS base_id, c.cited_id, c.contexts, c.context_source, c.intents,
       c.is_influential, b.topic_ids AS base_topics, b.top_topic AS base_top_topic,
       b.field_id AS base_field_id, b.field AS base_field, b.domain AS base_domain,
       b.primary_field_id AS base_primary_field_id, b.primary_domain_id AS base_primary_domain_id,
       CAST(c.cited_id % {n} AS INTEGER) AS _bucket
FROM citations c JOIN base b ON b.corpus_id = c.citing_id
"""
CANDIDATE_COLUMNS = ["citing_id", "cited_id", "contexts", "context_source", "intents"]

UNIVERSE_SCHEMA = pa.schema(
    [
        ("corpus_id", pa.int64()),
        ("year", pa.int32()),
        ("publication_date", pa.date32()),
        ("field_id", pa.int32()),
        ("domain_id", pa.int32()),
        ("in_top_venue", pa.bool_()),
    ]
)
UNIVERSE_SQL = """
SELECT p.corpus_id, p.year, p.publication_date, p.field_id, p.domain_id,
       p.venue_id IN (SELECT venue_id FROM top) AS in_top_venue
FROM papers p JOIN (SELECT DISTINCT id FROM ids) i ON i.id = p.corpus_id
WHERE p.abstract_length > 0 AND p.publication_date IS NOT NULL
ORDER BY p.corpus_id
"""
