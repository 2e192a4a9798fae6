"""Arrow schemas of the tables stages exchange, defined once.

Every table a stage publishes is cast to its schema here before writing, so a type drift in a
parser (an id read as string, a float year) fails loudly at the writer instead of surfacing as a
join that silently matches nothing three stages later.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

PASSAGE_CHARS = 2000  # what a grader reads of an abstract (B.5: the title, then this much)

TOPIC = pa.struct(
    [
        ("id", pa.int32()),
        ("name", pa.string()),
        ("score", pa.float32()),
        ("subfield_id", pa.int32()),
        ("subfield", pa.string()),
        ("field_id", pa.int32()),
        ("field", pa.string()),
        ("domain_id", pa.int32()),
        ("domain", pa.string()),
    ]
)

PAPERS = pa.schema(
    [
        ("corpus_id", pa.int64()),
        ("title", pa.string()),
        ("abstract", pa.string()),
        ("abstract_license", pa.string()),
        ("abstract_source", pa.string()),  # s2 | openalex | null
        ("abstract_length", pa.int32()),  # characters; lets scans test "has an abstract" cheaply
        ("year", pa.int32()),
        ("publication_date", pa.date32()),
        ("venue", pa.string()),
        ("venue_id", pa.string()),  # S2 publicationvenueid
        ("doi", pa.string()),  # lower case, no URL prefix
        ("mag_id", pa.int64()),
        ("pmid", pa.int64()),
        ("arxiv_id", pa.string()),
        ("openalex_id", pa.int64()),  # W-number of the matched work
        ("openalex_source_id", pa.int64()),  # S-number of the work's source
        ("join_key", pa.string()),  # doi | mag | pmid | null (no OpenAlex match)
        ("topics", pa.list_(TOPIC)),
        ("field_id", pa.int32()),  # of the primary (first) topic
        ("field", pa.string()),
        ("domain_id", pa.int32()),
        ("domain", pa.string()),
    ]
)

CITATIONS = pa.schema(
    [
        ("citing_id", pa.int64()),
        ("cited_id", pa.int64()),
        ("contexts", pa.list_(pa.string())),
        ("context_source", pa.string()),  # s2 | s2orc | null (no citing sentence known)
        ("intents", pa.list_(pa.string())),
        ("is_influential", pa.bool_()),
    ]
)

VENUES = pa.schema(
    [
        ("venue_id", pa.string()),
        ("name", pa.string()),
        ("type", pa.string()),  # journal | conference | … (S2's, else OpenAlex's)
        ("issn", pa.string()),
        ("openalex_source_id", pa.int64()),
        ("two_year_mean_citedness", pa.float64()),
        ("h_index", pa.int32()),
        ("n_papers", pa.int64()),
        ("field_id", pa.int32()),  # the field most of its papers belong to
        ("field", pa.string()),
        ("domain_id", pa.int32()),
        ("domain", pa.string()),
        ("field_share", pa.float64()),
    ]
)

REJECTS = pa.schema(
    [
        ("dataset", pa.string()),
        ("path", pa.string()),
        ("reason", pa.string()),
        ("raw", pa.string()),
    ]
)


def paper_text(title: pa.Array | pa.ChunkedArray, abstract: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A paper as one string, the same wherever one is needed — the passage a grader judges, the
    text a retriever is trained, pooled, evaluated and searched on — so no two stages see two
    different papers: "title. abstract", no second full stop after a title ending in . ? or !,
    either alone when the other is empty or null."""
    t = pc.utf8_trim_whitespace(pc.fill_null(one_chunk(title).cast(pa.string()), ""))
    a = pc.utf8_trim_whitespace(pc.fill_null(one_chunk(abstract).cast(pa.string()), ""))
    sep = pc.if_else(pc.match_substring_regex(t, r"[.?!]$"), " ", ". ")
    both = pc.binary_join_element_wise(t, sep, a, "")
    return pc.if_else(pc.equal(a, ""), t, pc.if_else(pc.equal(t, ""), a, both))


def passages(titles: pa.Array | pa.ChunkedArray, abstracts: pa.Array | pa.ChunkedArray) -> pa.Array:
    """What a grader reads of each paper — the usefulness grader (positives and negatives
    alike), the reranker's pointwise score: the one paper text, its abstract cut at 2,000
    characters (B.5: the title is read whole)."""
    cut = pc.utf8_slice_codeunits(
        pc.fill_null(one_chunk(abstracts).cast(pa.string()), ""), 0, PASSAGE_CHARS
    )
    return paper_text(titles, cut)


def passage(title: str | None, abstract: str | None) -> str:
    """`passages` of one paper."""
    return passages(pa.array([title], pa.string()), pa.array([abstract], pa.string()))[0].as_py()


def one_chunk(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """An Arrow column as one array (compute kernels and list offsets want one chunk)."""
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
