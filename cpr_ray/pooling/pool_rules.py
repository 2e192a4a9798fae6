"""The pooling rules (§3.3 N1) as pure functions over Arrow tables, testable without Ray.

- **Eligible candidates**: universe papers (top-venue papers and what they cite) with an
  abstract, published before q, never q itself nor its positive. "Before" compares dates, and a
  paper with only a year is taken at the edge of its year that makes the comparison strict: a
  candidate at its latest possible day (Dec 31), a query at its earliest (Jan 1). So a candidate
  dated 2014-05-02 precedes a query known only as 2015, and a candidate known only as 2015 never
  precedes a 2015 query.
- **Groups**: a candidate sharing an OpenAlex topic with q is ``shares_query_topic``; else one
  sharing a topic with the positive is ``shares_positive_topic`` (q's and the positive's topics
  are disjoint by construction); else ``other``.
- **Fill order** of each group: q's citations that the analogy judgment rejected (as
  not_analogy) come first, then a round-robin merge of the poolers' ranked lists for that group
  (rank 0 of every pooler in pooler order, then rank 1, …), duplicates skipped; each candidate
  keeps every pooler whose list holds it and its rank there. A group keeps at most as many
  candidates as its query's depth.
- **Pooling deeper**: a query with a group short of ``min_group_size`` is pooled again at
  ``top_k_short`` only when some pooler's list for that group was full at ``top_k``. The filters
  run inside each search, so a list shorter than its depth already holds every eligible paper the
  pooler ranks there, and a deeper search could not grow the group.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.mining.mining_rules import PAIR_FIELDS
from cpr_ray.pooling.pool_schemas import (
    CANDIDATES,
    DOCS,
    GROUPS,
    POOLED,
    QUERIES,
    REJECTED,
    SEARCH_QUERIES,
)
from cpr_ray.tables import duckdb_sql as duck
from cpr_ray.tables.schemas import paper_text

TEMPLATE_FIELD = re.compile(r"(\{title\}|\{abstract\})")
PAPER_TEMPLATE = "{title}. {abstract}"  # `schemas.paper_text`, the default doc_template

# the group of a candidate with topic ids {c}, for a query with topics {q} and positive {p}
GROUP_SQL = """CASE WHEN coalesce(list_has_any({c}, {q}), false) THEN 'shares_query_topic'
     WHEN coalesce(list_has_any({c}, {p}), false) THEN 'shares_positive_topic'
     ELSE 'other' END"""
GROUP_ORDER_SQL = "list_position(['" + "', '".join(GROUPS) + "'], {g})"


def _edge_of_year(year: pa.Array, month_day: str) -> pa.Array:
    text = pc.binary_join_element_wise(pc.cast(year, pa.string()), month_day, "-")
    days = pc.strptime(text, format="%Y-%m-%d", unit="s", error_is_null=True)
    return pc.cast(days, pa.date32())


def latest_date(date: pa.Array, year: pa.Array) -> pa.Array:
    """The last day a paper can have appeared: its date, else Dec 31 of its year (a candidate
    must precede the query even at this day)."""
    return pc.coalesce(pc.cast(date, pa.date32()), _edge_of_year(year, "12-31"))


def earliest_date(date: pa.Array, year: pa.Array) -> pa.Array:
    """The first day a paper can have appeared: its date, else Jan 1 of its year (the query's
    side of the comparison)."""
    return pc.coalesce(pc.cast(date, pa.date32()), _edge_of_year(year, "01-01"))


def topic_ids(topics: pa.Array | pa.ChunkedArray) -> pa.ListArray:
    """The ids of a list<struct<id, …>> topics column, as list<int32> (null lists stay null)."""
    arr = topics.combine_chunks() if isinstance(topics, pa.ChunkedArray) else topics
    ids = pc.cast(pc.struct_field(arr.values, "id"), pa.int32())
    return pa.ListArray.from_arrays(arr.offsets, ids, mask=arr.is_null())


def doc_text(title: pa.Array, abstract: pa.Array, template: str) -> pa.Array:
    """A paper's document text by template (`{title}[SEP]{abstract}`), missing parts empty; the
    default template is the one paper text every other stage uses (`schemas.paper_text`)."""
    if template == PAPER_TEMPLATE:
        return paper_text(title, abstract)
    fields = {"{title}": pc.fill_null(title, ""), "{abstract}": pc.fill_null(abstract, "")}
    parts = [fields.get(p, p) for p in TEMPLATE_FIELD.split(template) if p]
    if not any(not isinstance(p, str) for p in parts):
        raise ValueError(f"template {template!r} names neither {{title}} nor {{abstract}}")
    return pc.binary_join_element_wise(*parts, "")


def universe_docs(papers: pa.Table, universe_ids: pa.Array) -> pa.Table:
    """DOCS rows of the universe papers in a batch of ingest's papers: with an abstract and a
    known (latest) publication day — a paper of unknown date cannot be shown to precede q."""
    has_abstract = pc.greater(
        pc.utf8_length(pc.utf8_trim_whitespace(pc.fill_null(papers["abstract"], ""))), 0
    )
    t = papers.filter(pc.and_(pc.is_in(papers["corpus_id"], value_set=universe_ids), has_abstract))
    docs = pa.table(
        {
            "corpus_id": t["corpus_id"],
            "title": t["title"],
            "abstract": t["abstract"],
            "date_key": latest_date(t["publication_date"], t["year"]),
            "topic_ids": topic_ids(t["topics"]),
        }
    ).cast(DOCS)
    return docs.filter(pc.is_valid(docs["date_key"]))


def topic_group(c_topics: pa.Array, q_topics: pa.Array, p_topics: pa.Array) -> pa.Array:
    """The group of each (candidate, query) pair from the topic id lists of the candidate, the
    query's base paper and its positive."""
    pairs = pa.table({"c": c_topics, "q": q_topics, "p": p_topics})
    sql = f"SELECT {GROUP_SQL.format(c='c', q='q', p='p')} AS g FROM pairs"
    return duck.query(sql, pairs=pairs)["g"].combine_chunks()


def build_queries(positives: pa.Table, papers: pa.Table, depth: int) -> tuple[pa.Table, pa.Table]:
    """(queries, search queries): one query per (base paper, positive) of score-positives.

    `papers` holds corpus_id, publication_date, year and topic_ids of the base papers and the
    positives. The base date is q's earliest possible day; a base paper missing there gets no
    date, so no candidate is shown to precede it (its groups are then empty, and counted).
    """
    meta = papers.append_column(
        "base_date", earliest_date(papers["publication_date"], papers["year"])
    ).select(["corpus_id", "base_date", "topic_ids"])
    rows = duck.query(
        """SELECT p.base_id::VARCHAR || '-' || p.cited_id::VARCHAR AS query_id, p.query,
                  p.base_id, p.cited_id AS positive_id, p.base_field AS field,
                  p.base_domain AS domain, p.cited_field AS positive_field,
                  p.cited_domain AS positive_domain, p.crosses_field, p.crosses_domain,
                  b.base_date, b.topic_ids AS q_topics, d.topic_ids AS p_topics
           FROM positives p
           LEFT JOIN meta b ON b.corpus_id = p.base_id
           LEFT JOIN meta d ON d.corpus_id = p.cited_id
           QUALIFY row_number() OVER (PARTITION BY p.base_id, p.cited_id ORDER BY p.query) = 1
           ORDER BY query_id""",
        positives=positives.select(["query", "base_id", "cited_id", *PAIR_FIELDS]),
        meta=meta,
    )
    queries = rows.select(QUERIES.names).cast(QUERIES)
    depths = pa.array([depth] * rows.num_rows, pa.int32())
    search = rows.append_column("depth", depths).select(SEARCH_QUERIES.names)
    return queries, search.cast(SEARCH_QUERIES)


def rejected_citations(judged: pa.Table, queries: pa.Table, docs: pa.Table) -> pa.Table:
    """(query_id, candidate_id, group) of each query's eligible citations that the analogy
    judgment rejected.

    Rejected means an `ok` answer deciding not_analogy: a failed call, or a passing pair held
    out because its inputs were flagged, is no judgment against the pair. `queries` carries the
    search columns (base_id, positive_id, base_date, q_topics, p_topics); `docs` the universe
    (corpus_id, date_key, topic_ids).
    """
    return duck.query(
        f"""SELECT q.query_id, j.cited_id AS candidate_id,
                   {GROUP_SQL.format(c="d.topic_ids", q="q.q_topics", p="q.p_topics")} AS "group"
            FROM queries q
            JOIN (SELECT DISTINCT base_id, cited_id FROM judged
                  WHERE status = 'ok' AND decision = 'not_analogy') j ON j.base_id = q.base_id
            JOIN docs d ON d.corpus_id = j.cited_id
            WHERE j.cited_id <> q.positive_id AND j.cited_id <> q.base_id
              AND d.date_key < q.base_date
            ORDER BY q.query_id, candidate_id""",
        judged=judged.select(["base_id", "cited_id", "status", "decision"]),
        queries=queries.select(
            ["query_id", "base_id", "positive_id", "base_date", "q_topics", "p_topics"]
        ),
        docs=docs.select(["corpus_id", "date_key", "topic_ids"]),
    )


def round_robin(
    hits: pa.Table, rejected: pa.Table, poolers: Sequence[str], depths: pa.Table
) -> pa.Table:
    """CANDIDATES: each (query, group) filled with its rejected citations, then the round-robin
    merge of the poolers' ranked lists, duplicates skipped, at most the query's depth.

    `hits` are HITS rows; `rejected` (query_id, candidate_id, group); `depths` (query_id, depth).
    Round-robin order is rank·P + the pooler's place in `poolers`, a candidate taking its best;
    rejected citations come first, in that order too (those no pooler ranked last), ties by id.
    """
    order = pa.table({"pooler": list(poolers), "pooler_index": list(range(len(poolers)))})
    table = duck.query(
        f"""WITH h AS (
                SELECT h.query_id, h."group", h.candidate_id,
                       min(h.rank * {len(poolers)} + o.pooler_index) AS rr,
                       list(h.pooler ORDER BY o.pooler_index) AS poolers,
                       list(h.rank ORDER BY o.pooler_index) AS pooler_ranks
                FROM hits h JOIN pooler_order o USING (pooler)
                GROUP BY h.query_id, h."group", h.candidate_id),
            c AS (
                SELECT coalesce(r.query_id, h.query_id) AS query_id,
                       coalesce(r.candidate_id, h.candidate_id) AS candidate_id,
                       coalesce(r."group", h."group") AS "group",
                       r.candidate_id IS NOT NULL AS rejected, h.rr,
                       coalesce(h.poolers, []::VARCHAR[]) AS poolers,
                       coalesce(h.pooler_ranks, []::INTEGER[]) AS pooler_ranks
                FROM rejected r FULL OUTER JOIN h
                  ON r.query_id = h.query_id AND r.candidate_id = h.candidate_id),
            ranked AS (
                SELECT c.*, d.depth,
                       (row_number() OVER (PARTITION BY c.query_id, c."group"
                                           ORDER BY c.rejected DESC, c.rr NULLS LAST,
                                                    c.candidate_id) - 1)::INTEGER AS position
                FROM c JOIN depths d USING (query_id))
            SELECT query_id, candidate_id, "group", position,
                   CASE WHEN rejected THEN '{REJECTED}' ELSE '{POOLED}' END AS source,
                   poolers, pooler_ranks
            FROM ranked WHERE position < depth
            ORDER BY query_id, {GROUP_ORDER_SQL.format(g='"group"')}, position""",
        hits=hits.select(["query_id", "group", "candidate_id", "pooler", "rank"]),
        rejected=rejected.select(["query_id", "candidate_id", "group"]),
        pooler_order=order,
        depths=depths.select(["query_id", "depth"]),
    )
    return table.cast(CANDIDATES)


def deeper_queries(sizes: pa.Table, hits: pa.Table, min_group_size: int, depth: int) -> pa.Array:
    """The query ids to pool again deeper: a group short of `min_group_size` (`sizes` rows of
    `group_sizes`) that some pooler's HITS list filled to `depth`."""
    return duck.query(
        f"""SELECT DISTINCT s.query_id
            FROM sizes s
            JOIN (SELECT query_id, "group", pooler, count(*) AS n
                  FROM hits GROUP BY query_id, "group", pooler) h
              ON h.query_id = s.query_id AND h."group" = s."group"
            WHERE s.candidates < {int(min_group_size)} AND h.n >= {int(depth)}
            ORDER BY s.query_id""",
        sizes=sizes.select(["query_id", "group", "candidates"]),
        hits=hits.select(["query_id", "group", "pooler"]),
    )["query_id"].combine_chunks()


def group_sizes(candidates: pa.Table, query_ids: pa.Array) -> pa.Table:
    """(query_id, group, candidates) for every query and every group, empty groups included
    (a group is short when it holds fewer than the pooling's min_group_size)."""
    return duck.query(
        f"""SELECT q.query_id, g."group", count(c.candidate_id)::INTEGER AS candidates
            FROM queries q CROSS JOIN groups g
            LEFT JOIN candidates c ON c.query_id = q.query_id AND c."group" = g."group"
            GROUP BY q.query_id, g."group"
            ORDER BY q.query_id, {GROUP_ORDER_SQL.format(g='g."group"')}""",
        queries=pa.table({"query_id": query_ids}),
        groups=pa.table({"group": list(GROUPS)}),
        candidates=candidates.select(["query_id", "group", "candidate_id"]),
    )
