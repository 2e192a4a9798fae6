"""The fixed design of the synthetic corpus: id bases, shares and sizes, the word lists and
templates its text is made from, and where each table's shards go."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from cpr_ray.corpus.taxonomy import FIELDS

SNAPSHOT_DATE = "2026-10-01"
CORPUS_ID_BASE = 1_000
WORK_ID_OFFSET = 1_000_000_000
OA_ONLY_WORK_BASE = 4_000_000_000
SOURCE_ID_BASE = 100_000_000
PMID_BASE = 10_000_000
TOPIC_ID_BASE = 10_001

# How an entity (a paper, or a work without a paper) joins across the two sources.
DOI, MAG_ONLY, PUBMED_ONLY, S2_ONLY, OA_ONLY = range(5)
_MATCH_SHARES = (0.85, 0.10, 0.05)  # DOI, MAG_ONLY, PUBMED_ONLY among matched papers
_OA_ONLY_SHARE = 0.05

FIELD_IDS = np.array(sorted(FIELDS))
SUBFIELDS_PER_FIELD = 10
TOPICS_PER_SUBFIELD = 15
TOPICS_PER_FIELD = SUBFIELDS_PER_FIELD * TOPICS_PER_SUBFIELD
_TAXONOMY_SEED = 20261001
_WORDS_PER_FIELD = 200
_SENTENCES_PER_FIELD = 256
_CONTEXTS_PER_FIELD = 128
_TIMESTAMPS = 4096

_YEARS = np.arange(1990, 2026)
_MIN_VENUES = 30
_PAPERS_PER_VENUE = 500
_HOME_VENUE_SHARE = 0.85
_CROSS_FIELD_CITATION = 0.22
_UNRESOLVED_CITATION = 0.10
_CITATION_ROUNDS = 8
_ABSTRACT_SHARE = 0.8
_INVERTED_INDEX_SHARE = 0.03
_UPPER_DOI_SHARE = 0.25
_CONFERENCE_SHARE = {17: 0.5, 22: 0.25}  # by home field; 0.03 elsewhere

_OA_STATUSES = [None, "GOLD", "GREEN", "HYBRID", "BRONZE"]
_LICENSES = ["CCBY", "CCBYNC", "CC0", "CCBYSA", None]
_INTENT_SETS = [
    ["background"],
    ["methodology"],
    ["result"],
    ["methodology", "background"],
    ["background", "result"],
]
_CONJUNCTIONS = ["of", "for", "in", "with", "under"]

_ABSTRACT_TEMPLATES = [
    "The {a} {b} of {c} {d} remains poorly understood.",
    "We propose a {a} {b} model that improves {c} {d}.",
    "Results show that {a} {b} reduces {c} {d} by {n} percent.",
    "Our analysis of {n} {a} {b} samples reveals a strong {c} effect.",
    "These findings suggest {a} {b} as a target for {c} {d}.",
    "We compare {a} {b} with {c} {d} across {n} settings.",
    "A {a} {b} framework is derived from first principles of {c} {d}.",
    "The proposed {a} {b} outperforms existing {c} baselines on {n} benchmarks.",
]
_CONTEXT_TEMPLATES = [
    "{A} {b} was shown to improve {c} {d} [{n}].",
    "Previous work on {a} {b} reported a {c} {d} ({n}).",
    "We follow the {a} {b} protocol of earlier {c} studies [{n}].",
    "Similar {a} {b} results were obtained for {c} {d} [{n}].",
]
_JOURNAL_NAMES = [
    "Journal of {A} {B}",
    "{A} {B} Letters",
    "Annals of {A} {B}",
    "International Journal of {A} {B}",
    "{A} {B} Reviews",
]
_CONFERENCE_NAMES = [
    "Proceedings of the {A} {B} Conference",
    "International Symposium on {A} {B}",
    "Workshop on {A} {B}",
]


@dataclass(frozen=True)
class SyntheticStats:
    """Records written per table (malformed lines not included) and malformed lines per table."""

    papers: int
    abstracts: int
    citations: int
    venues: int
    works: int
    sources: int
    malformed: Mapping[str, int]


@dataclass(frozen=True)
class _Table:
    """One output table: where its shards go and how its malformed lines break the id."""

    name: str
    pattern: str  # relative path with {shard:04d}
    id_key: str
    bad_id: str


_PAPERS = _Table("papers", "s2/papers/papers-{shard:04d}.jsonl.gz", "corpusid", "CorpusId:unknown")
_ABSTRACTS = _Table("abstracts", "s2/abstracts/abstracts-{shard:04d}.jsonl.gz", "corpusid", "n/a")
_CITATIONS = _Table(
    "citations", "s2/citations/citations-{shard:04d}.jsonl.gz", "citingcorpusid", "None"
)
_VENUES = _Table(
    "publication-venues", "s2/publication-venues/publication-venues-{shard:04d}.jsonl.gz", "id", ""
)
_WORKS = _Table(
    "works",
    f"openalex/works/updated_date={SNAPSHOT_DATE}/part_{{shard:04d}}.gz",
    "id",
    "https://openalex.org/Wundefined",
)
_SOURCES = _Table(
    "sources", f"openalex/sources/updated_date={SNAPSHOT_DATE}/part_{{shard:04d}}.gz", "id", ""
)
_TABLES = (_PAPERS, _ABSTRACTS, _CITATIONS, _VENUES, _WORKS, _SOURCES)
