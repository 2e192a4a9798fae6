"""Mining as one DuckDB process over the whole tables: the plain path the bucketed stage must
equal (tests) and is measured against (benchmarks/mine.py).

Same rules (`mining.rules`), no buckets, no Ray, no layout: what a user would write first. Kept
apart from the stage on purpose, so that an error in the stage's bucketing cannot hide in both.
"""

from __future__ import annotations

from dataclasses import dataclass

import lance
import pyarrow as pa
import pyarrow.parquet as pq

from cpr_ray.config import MiningConfig
from cpr_ray.mining import mining_rules as rules
from cpr_ray.tables import duckdb_sql as duck

CITATION_COLUMNS = [
    "citing_id",
    "cited_id",
    "contexts",
    "context_source",
    "intents",
    "is_influential",
]


@dataclass(frozen=True)
class Mined:
    base: pa.Table  # the drawn base papers, in the stage's order
    pairs: pa.Table  # PAIR_SCHEMA, ordered by base_id, cited_id
    universe: pa.Array  # corpus ids of the pooling universe, sorted


def load_tables(
    papers_uri: str,
    citations_uri: str,
    venues_uri: str,
    *,
    versions: tuple[int, int] | None = None,
    storage_options: dict[str, str] | None = None,
    paper_columns: list[str],
) -> tuple[pa.Table, pa.Table, pa.Table]:
    """The whole papers and citations tables (at `versions`, if given) and the venues."""
    p_version, c_version = versions or (None, None)
    papers = lance.dataset(papers_uri, version=p_version, storage_options=storage_options)
    citations = lance.dataset(citations_uri, version=c_version, storage_options=storage_options)
    return (
        papers.to_table(columns=paper_columns),
        citations.to_table(columns=CITATION_COLUMNS),
        pq.read_table(venues_uri),
    )


def mine_whole(
    papers: pa.Table, citations: pa.Table, venues: pa.Table, m: MiningConfig, *, threads: int
) -> Mined:
    top = rules.top_venues(
        venues,
        top_share=m.top_share,
        min_papers=m.min_venue_papers,
        conference_policy=m.conference_policy,
        threads=threads,
    )
    top_citing = duck.query(
        """SELECT c.* FROM citations c JOIN papers p ON p.corpus_id = c.citing_id
           JOIN top t ON t.venue_id = p.venue_id""",
        threads,
        citations=citations,
        papers=papers.select(["corpus_id", "venue_id"]),
        top=top.select(["venue_id"]),
    )
    with_context = top_citing.filter(rules.has_citing_sentence(top_citing)).select(["citing_id"])
    eligible = rules.eligible_base_papers(
        papers,
        top,
        with_context,
        threads=threads,
        **rules.eligibility(m),
    )
    base, _ = rules.sample_per_field(eligible, m.base_per_field, threads=threads)
    candidates = duck.query(
        """SELECT c.citing_id AS base_id, c.cited_id, c.contexts, c.context_source, c.intents,
                  c.is_influential, b.topic_ids AS base_topics, b.top_topic AS base_top_topic,
                  b.field_id AS base_field_id, b.field AS base_field, b.domain AS base_domain,
                  b.primary_field_id AS base_primary_field_id,
                  b.primary_domain_id AS base_primary_domain_id
           FROM citations c JOIN base b ON b.corpus_id = c.citing_id""",
        threads,
        citations=citations,
        base=base,
    )
    pairs = rules.cross_topic_pairs(candidates, papers, threads=threads)
    if not m.keep_pairs_without_context:
        pairs = pairs.filter(pairs["has_context"])
    universe = duck.query(
        """WITH ids AS (
               SELECT p.corpus_id AS id FROM papers p JOIN top t USING (venue_id)
               UNION SELECT c.cited_id FROM top_citing c)
           SELECT p.corpus_id FROM papers p JOIN ids ON ids.id = p.corpus_id
           WHERE p.abstract_length > 0 AND p.publication_date IS NOT NULL
           ORDER BY p.corpus_id""",
        threads,
        papers=papers,
        top=top,
        top_citing=top_citing.select(["cited_id"]),
    )["corpus_id"].combine_chunks()
    return Mined(base, pairs, universe)
