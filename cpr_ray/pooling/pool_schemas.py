"""Arrow schemas of what the pool stage publishes (the contract judge-negatives and export read)
and of the tables its steps pass each other.

Published: ``queries`` (one row per positive) and ``candidates`` (one row per candidate of a
query's group, in fill order). Internal: ``DOCS`` (the candidate universe with its texts, date
key and topic ids), ``SEARCH_QUERIES`` (what a pooler's search actor reads) and ``HITS`` (one
pooler's ranked list of one group of one query).
"""

from __future__ import annotations

import pyarrow as pa

# group names, in the order judge-negatives walks them and their codes in search arrays
GROUPS = ("shares_query_topic", "shares_positive_topic", "other")
REJECTED, POOLED = "rejected_citation", "pooled"

QUERIES = pa.schema(
    [
        ("query_id", pa.string()),  # f"{base_id}-{positive_id}"
        ("query", pa.string()),
        ("base_id", pa.int64()),
        ("positive_id", pa.int64()),
        ("field", pa.string()),  # the base paper's (the query's)
        ("domain", pa.string()),
        ("positive_field", pa.string()),
        ("positive_domain", pa.string()),
        ("crosses_field", pa.bool_()),
        ("crosses_domain", pa.bool_()),
        ("base_date", pa.date32()),  # earliest day q can have appeared: candidates precede it
    ]
)

CANDIDATES = pa.schema(
    [
        ("query_id", pa.string()),
        ("candidate_id", pa.int64()),
        ("group", pa.string()),  # one of GROUPS
        ("position", pa.int32()),  # 0-based order within (query, group)
        ("source", pa.string()),  # rejected_citation | pooled
        ("poolers", pa.list_(pa.string())),  # every pooler whose list holds it, in pooler order
        ("pooler_ranks", pa.list_(pa.int32())),  # its 0-based rank in each of those lists
    ]
)

DOCS = pa.schema(
    [
        ("corpus_id", pa.int64()),
        ("title", pa.string()),
        ("abstract", pa.string()),
        ("date_key", pa.date32()),  # latest day it can have appeared (date, else Dec 31)
        ("topic_ids", pa.list_(pa.int32())),
    ]
)

SEARCH_QUERIES = pa.schema(
    [
        ("query_id", pa.string()),
        ("query", pa.string()),
        ("base_id", pa.int64()),
        ("base_date", pa.date32()),
        ("positive_id", pa.int64()),
        ("q_topics", pa.list_(pa.int32())),
        ("p_topics", pa.list_(pa.int32())),
        ("depth", pa.int32()),  # top_k, or top_k_short when pooled again
    ]
)

HITS = pa.schema(
    [
        ("query_id", pa.string()),
        ("group", pa.string()),
        ("candidate_id", pa.int64()),
        ("pooler", pa.string()),
        ("rank", pa.int32()),  # 0-based, within this pooler's list for this group
    ]
)

# HITS of one shard, with the keys one index over the whole universe ranks by after the score
SHARD_HITS = pa.schema(
    [
        *HITS,
        ("score", pa.float32()),
        ("day", pa.int32()),  # the candidate's date_key in days since 1970: its search order
    ]
)
