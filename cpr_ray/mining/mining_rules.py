"""The mining rules as pure functions over Arrow tables (DuckDB inside), testable without Ray.

- Top venues: per OpenAlex field, the venues in the top share by 2-year mean citedness.
- Base papers: eligible papers of those venues, sampled to the same number per field with a seed.
- Pairs: citations q → d whose topic sets are disjoint, T(q) ∩ T(d) = ∅, by topic id.
"""

from __future__ import annotations

from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.config import MiningConfig
from cpr_ray.tables import duckdb_sql as duck

ConferencePolicy = Literal["rank_separately", "pool", "exclude"]


def top_venues(
    venues: pa.Table,
    *,
    top_share: float,
    min_papers: int,
    conference_policy: ConferencePolicy,
    threads: int = 1,
) -> pa.Table:
    """Venues in the top `top_share` of their field by 2-year mean citedness.

    Conference citedness runs low, so by default conferences are ranked among the conferences of
    their field (`rank_separately`) instead of being pushed out by journals; `pool` ranks all
    together, `exclude` drops them. A venue needs `min_papers` papers in the corpus and a known
    field and citedness to be ranked at all. Output columns: venue_id, name, type, field_id,
    field, domain_id, domain, two_year_mean_citedness, n_papers, field_share, rank, n_ranked.
    """
    group = (
        "field_id, (type = 'conference')" if conference_policy == "rank_separately" else "field_id"
    )
    where = "AND coalesce(type, '') <> 'conference'" if conference_policy == "exclude" else ""
    sql = f"""
    WITH eligible AS (
        SELECT * FROM venues
        WHERE field_id IS NOT NULL AND two_year_mean_citedness IS NOT NULL
          AND n_papers >= {int(min_papers)} {where}
    ), ranked AS (
        SELECT *,
            row_number() OVER (PARTITION BY {group}
                               ORDER BY two_year_mean_citedness DESC, venue_id) AS rank,
            count(*) OVER (PARTITION BY {group}) AS n_ranked
        FROM eligible
    )
    SELECT venue_id, name, type, field_id, field, domain_id, domain, two_year_mean_citedness,
           n_papers, field_share, rank, n_ranked
    FROM ranked
    WHERE rank <= greatest(1, ceil({float(top_share)} * n_ranked))
    ORDER BY field_id, type, rank
    """
    return duck.query(sql, threads, venues=venues)


def sampling_key_sql(seed: int, column: str = "corpus_id") -> str:
    """A seeded pseudo-random order that any task computes alike (no shared RNG state)."""
    return f"hash({column}, {int(seed)})"


def has_citing_sentence(citations: pa.Table) -> pa.ChunkedArray:
    """Whether a citation carries a citing sentence (from S2 contexts or recovered from S2ORC):
    the one predicate the stage and its benchmark use for `base_requires_context`."""
    return pc.is_valid(citations["context_source"])


def eligibility(m: MiningConfig) -> dict[str, Any]:
    """The mining keys `eligible_base_papers` takes: the stage and its benchmark pass the same."""
    return {
        "year_min": m.year_min,
        "year_max": m.year_max,
        "require_context": m.base_requires_context,
        "seed": m.seed,
    }


def eligible_base_papers(
    papers: pa.Table,
    top: pa.Table,
    has_context: pa.Table,
    *,
    year_min: int,
    year_max: int,
    require_context: bool,
    seed: int,
    threads: int = 1,
) -> pa.Table:
    """Papers of top venues in the year range with an abstract (and a citing sentence, if
    `require_context`), each labelled with its venue's field and a seeded sampling key.

    `has_context` lists `citing_id`s with at least one citation that has a citing sentence.
    Row-wise: a paper's row depends on its own row, its own citations and its venue's, which is
    what lets a refresh recompute only the papers a diff reaches (`cap_per_bucket` then takes
    the part of them the per-field draw needs).
    """
    context_rule = "AND c.citing_id IS NOT NULL" if require_context else ""
    sql = f"""
    SELECT p.corpus_id, t.field_id, t.field, t.domain_id, t.domain, p.venue_id, p.year,
           p.publication_date, list_transform(p.topics, lambda x: x.id) AS topic_ids,
           p.topics[1].name AS top_topic, p.field_id AS primary_field_id,
           p.domain_id AS primary_domain_id,
           c.citing_id IS NOT NULL AS has_context,
           {sampling_key_sql(seed, "p.corpus_id")} AS sample_key
    FROM papers p
    JOIN top t ON t.venue_id = p.venue_id
    LEFT JOIN (SELECT DISTINCT citing_id FROM has_context) c ON c.citing_id = p.corpus_id
    WHERE p.year BETWEEN {int(year_min)} AND {int(year_max)}
      AND p.abstract_length > 0
      AND p.topics IS NOT NULL AND len(p.topics) > 0
      {context_rule}
    """
    return duck.query(sql, threads, papers=papers, top=top, has_context=has_context)


def cap_per_bucket(
    eligible: pa.Table, per_field_cap: int | None, num_buckets: int, *, threads: int = 1
) -> pa.Table:
    """The first `per_field_cap` eligible papers per key bucket (`corpus_id % num_buckets`) and
    field in sampling order: what each bucket of the build contributes to the per-field draw
    (the draw is the same from them as from every eligible paper; the per-field report counts
    them). The build caps one bucket at a time, a refresh its whole kept eligible set at once:
    both through here, so both report alike."""
    if not per_field_cap:
        return eligible
    sql = f"""
    SELECT * FROM eligible
    QUALIFY row_number() OVER (PARTITION BY corpus_id % {int(num_buckets)}, field_id
                               ORDER BY sample_key, corpus_id) <= {int(per_field_cap)}
    """
    return duck.query(sql, threads, eligible=eligible)


def sample_per_field(
    eligible: pa.Table, per_field: int | None, *, threads: int = 1
) -> tuple[pa.Table, pa.Table]:
    """The same number of base papers from every field that has any (seeded order).

    `per_field=None` draws as many as the smallest non-empty field allows, so every field gets
    exactly the same count. Returns (drawn papers, per-field report of eligible and drawn).
    """
    n = "(SELECT min(n) FROM counts)" if per_field is None else str(int(per_field))
    sql = f"""
    WITH counts AS (SELECT field_id, count(*) AS n FROM eligible GROUP BY field_id),
    drawn AS (
        SELECT * FROM eligible
        QUALIFY row_number() OVER (PARTITION BY field_id ORDER BY sample_key, corpus_id)
                <= {n}
    )
    SELECT * FROM drawn ORDER BY field_id, sample_key
    """
    drawn = duck.query(sql, threads, eligible=eligible)
    report = duck.query(
        """SELECT e.field_id, any_value(e.field) AS field, count(*) AS eligible,
                  coalesce(any_value(d.n), 0) AS drawn
           FROM eligible e
           LEFT JOIN (SELECT field_id, count(*) AS n FROM drawn GROUP BY field_id) d
             USING (field_id)
           GROUP BY e.field_id ORDER BY e.field_id""",
        threads,
        eligible=eligible,
        drawn=drawn,
    )
    return drawn, report


PAIR_SCHEMA = pa.schema(
    [
        ("base_id", pa.int64()),
        ("cited_id", pa.int64()),
        ("contexts", pa.list_(pa.string())),
        ("context_source", pa.string()),
        ("has_context", pa.bool_()),
        ("intents", pa.list_(pa.string())),
        ("is_influential", pa.bool_()),
        ("base_topics", pa.list_(pa.int32())),
        ("cited_topics", pa.list_(pa.int32())),
        ("base_top_topic", pa.string()),
        ("cited_top_topic", pa.string()),
        ("base_field_id", pa.int32()),
        ("base_field", pa.string()),
        ("base_domain", pa.string()),
        ("cited_field_id", pa.int32()),
        ("cited_field", pa.string()),
        ("cited_domain", pa.string()),
        ("crosses_field", pa.bool_()),
        ("crosses_domain", pa.bool_()),
    ]
)
# where each side of a pair sits and whether the pair crosses a field or a domain: what every
# stage downstream of mining carries along with a pair (the export's shares come from them)
PAIR_FIELDS = (
    "base_field",
    "base_domain",
    "cited_field",
    "cited_domain",
    "crosses_field",
    "crosses_domain",
)


def cross_topic_pairs(candidates: pa.Table, cited: pa.Table, *, threads: int = 1) -> pa.Table:
    """Citations of base papers (`candidates`: base side already attached) joined to the cited
    papers' topics, keeping those whose topic id sets are disjoint; both sides need topics.

    `base_field…` is the field the base paper was sampled under (its venue's); crossing a field
    or domain compares the primary topics' fields and domains of the two papers.
    """
    sql = """
    SELECT c.base_id, c.cited_id, c.contexts, c.context_source,
        len(coalesce(c.contexts, [])) > 0 AS has_context,
        c.intents, c.is_influential,
        c.base_topics, list_transform(d.topics, lambda t: t.id) AS cited_topics,
        c.base_top_topic, d.topics[1].name AS cited_top_topic,
        c.base_field_id, c.base_field, c.base_domain,
        d.field_id AS cited_field_id, d.field AS cited_field, d.domain AS cited_domain,
        c.base_primary_field_id IS DISTINCT FROM d.field_id AS crosses_field,
        c.base_primary_domain_id IS DISTINCT FROM d.domain_id AS crosses_domain
    FROM candidates c JOIN cited d ON d.corpus_id = c.cited_id
    WHERE len(c.base_topics) > 0 AND d.topics IS NOT NULL AND len(d.topics) > 0
      AND len(list_intersect(c.base_topics, list_transform(d.topics, lambda t: t.id))) = 0
      AND c.cited_id <> c.base_id
    ORDER BY c.base_id, c.cited_id
    """
    return duck.query(sql, threads, candidates=candidates, cited=cited).cast(PAIR_SCHEMA)
