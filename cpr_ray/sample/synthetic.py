"""A deterministic synthetic raw corpus: Semantic Scholar bulk shards plus an OpenAlex snapshot.

Why: benchmarks and scale tests need the build's raw inputs at any size (a million papers on a
laptop, hundreds of millions on a cluster) without downloading or redistributing real data, and
with a known ground truth to check the build against. The records copy the real formats in
`shared/reference` (keys, nesting, URL-form ids, ids as strings in some exports, upper-case DOIs,
broken lines), so the ingest reads this output exactly as it reads the real dumps:

    OUT/s2/papers/papers-NNNN.jsonl.gz            OUT/s2/abstracts/abstracts-NNNN.jsonl.gz
    OUT/s2/citations/citations-NNNN.jsonl.gz
    OUT/s2/publication-venues/publication-venues-0000.jsonl.gz
    OUT/openalex/works/updated_date=2026-10-01/part_NNNN.gz
    OUT/openalex/sources/updated_date=2026-10-01/part_0000.gz

Ground truth, fixed by design:
- Paper i has corpusid `CORPUS_ID_BASE + 3i + (0..2)`. A share `overlap` of papers has an
  OpenAlex work `W<WORK_ID_OFFSET + corpusid>`, joinable by DOI (85%; the S2 DOI is upper-case for
  a quarter of papers, the OpenAlex one a lower-case URL), else only by MAG (10%) or only by PubMed
  (5%). The other papers have no work; about 5% of works (`W >= OA_ONLY_WORK_BASE`) have no
  paper. MAG ids equal the W number, as in OpenAlex.
- Venue v is an S2 publication venue (a uuid) and OpenAlex source `S<SOURCE_ID_BASE + v>`; they
  share an ISSN (S2 `issn`/`alternate_issns` against OpenAlex `issn_l`/`issn`). Repository
  sources have no S2 venue and no ISSN.
- Topics: the 26 fields and 4 domains of `taxonomy.py`, 10 subfields per field (id field*100+k)
  and 15 topics per subfield, names made up but the same for every seed (the hierarchy is
  OpenAlex's, not the corpus's). A work has 1-3 topics, mostly within its first topic's field.
- Citations run between S2 papers, ~80% within the citing field, to a paper published no later
  than the citing one where one exists, half to recent papers and half by a log-normal fitness
  (a heavy tail of citation counts); ~10% are unresolved (null cited id); pairs are unique.
- Malformed lines are extra lines (they never replace a record): truncated JSON, non-JSON
  garbage, a record without its id, a record with a bad id; each shard of each S2 table and of
  the works gets Binomial(rows, malformed_rate) of them at random positions.

Speed: columns are built with numpy, pyarrow and polars; polars encodes the JSON lines and gzips
them (level 1). Python loops only over small things (taxonomy, venues, malformed lines, the few
works with an abstract inverted index). 1M papers and 10M citations take about 45 s on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from cpr_ray.corpus.taxonomy import DOMAINS, FIELDS, field_name

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


# ---------------------------------------------------------------- taxonomy and text (any seed)


@dataclass(frozen=True)
class _Taxonomy:
    field_weight: np.ndarray  # (26,) share of papers per field index
    words: list[list[str]]  # per field index
    flat_words: pl.Series  # field f's word k at f*_WORDS_PER_FIELD + k
    topics: pa.StructArray  # per topic index t = field*150 + subfield*15 + k; no score
    topic_names: pl.Series
    abstract_sentences: pl.Series  # field f's at f*_SENTENCES_PER_FIELD + k
    context_sentences: pa.Array  # field f's at f*_CONTEXTS_PER_FIELD + k


def _pseudo_words(rng: np.random.Generator, n: int) -> list[str]:
    onsets = "b c d f g k l m n p r s t v z br cr dr fl gr pl pr st tr".split()
    vowels = "a e i o u ai ea io ou".split()
    codas = ["", "", "n", "r", "s", "l", "x", "nd", "st"]
    words: dict[str, None] = {}
    while len(words) < n:
        syllables = (
            onsets[rng.integers(len(onsets))] + vowels[rng.integers(len(vowels))]
            for _ in range(int(rng.integers(2, 4)))
        )
        words.setdefault("".join(syllables) + codas[rng.integers(len(codas))])
    return list(words)


def _fill(rng: np.random.Generator, template: str, words: list[str]) -> str:
    a, b, c, d = (words[i] for i in rng.choice(len(words), 4, replace=False))
    return template.format(
        a=a, b=b, c=c, d=d, A=a.capitalize(), B=b.capitalize(), n=int(rng.integers(2, 100))
    )


def _sentences(
    rng: np.random.Generator, templates: list[str], words: list[str], n: int
) -> list[str]:
    return [_fill(rng, templates[rng.integers(len(templates))], words) for _ in range(n)]


def _node(kind: str, ids: Sequence[int], names: Sequence[str]) -> pa.StructArray:
    return pa.StructArray.from_arrays(
        [pa.array([f"https://openalex.org/{kind}{i}" for i in ids]), pa.array(names)],
        names=["id", "display_name"],
    )


@cache
def _taxonomy() -> _Taxonomy:
    rng = np.random.default_rng(_TAXONOMY_SEED)
    n_fields = len(FIELD_IDS)
    flat = _pseudo_words(rng, n_fields * _WORDS_PER_FIELD)
    words = [flat[f * _WORDS_PER_FIELD : (f + 1) * _WORDS_PER_FIELD] for f in range(n_fields)]
    subfield_names = [
        f"General {field_name(fid)}" if s == 0 else _fill(rng, "{A} {b}", words[f])
        for f, fid in enumerate(FIELD_IDS)
        for s in range(SUBFIELDS_PER_FIELD)
    ]
    topic_names = [
        _fill(rng, "{A} {b} and {c} {d}", words[t // TOPICS_PER_FIELD])
        for t in range(n_fields * TOPICS_PER_FIELD)
    ]
    t = np.arange(len(topic_names))
    field_ids = FIELD_IDS[t // TOPICS_PER_FIELD]
    subfield = t // TOPICS_PER_SUBFIELD
    domain_ids = [FIELDS[f][1] for f in field_ids]
    topics = pa.StructArray.from_arrays(
        [
            pa.array([f"https://openalex.org/T{TOPIC_ID_BASE + i}" for i in t]),
            pa.array(topic_names),
            _node(
                "subfields/",
                field_ids * 100 + subfield % SUBFIELDS_PER_FIELD,
                [subfield_names[s] for s in subfield],
            ),
            _node("fields/", field_ids, [field_name(f) for f in field_ids]),
            _node("domains/", domain_ids, [DOMAINS[d] for d in domain_ids]),
        ],
        names=["id", "display_name", "subfield", "field", "domain"],
    )
    weight = rng.lognormal(0.0, 0.5, n_fields)
    weight[FIELD_IDS == 27] *= 4  # Medicine dominates real corpora
    return _Taxonomy(
        field_weight=weight / weight.sum(),
        words=words,
        flat_words=pl.Series(flat),
        topics=topics,
        topic_names=pl.Series(topic_names),
        abstract_sentences=pl.Series(
            [
                s
                for w in words
                for s in _sentences(rng, _ABSTRACT_TEMPLATES, w, _SENTENCES_PER_FIELD)
            ]
        ),
        context_sentences=pa.array(
            [s for w in words for s in _sentences(rng, _CONTEXT_TEMPLATES, w, _CONTEXTS_PER_FIELD)]
        ),
    )


@cache
def _field_abbreviations() -> pl.Series:
    """Lower-case initials per field index (DOI stems: letters make DOI case matter)."""
    return pl.Series(
        [
            "".join(w[0] for w in field_name(f).replace(",", "").split() if w[0].isupper()).lower()
            for f in FIELD_IDS
        ]
    )


def _timestamps(
    rng: np.random.Generator, start: str, days: int, unit: str, suffix: str
) -> pl.Series:
    """A pool of ISO timestamps in [start, start + days); tables draw rows from it."""
    ticks = rng.integers(0, days * 86_400 * (1000 if unit == "ms" else 1_000_000), _TIMESTAMPS)
    stamps = np.datetime64(start, unit) + ticks.astype(f"timedelta64[{unit}]")
    return pl.Series([s + suffix for s in np.datetime_as_string(stamps, unit=unit)])


# ---------------------------------------------------------------- venues


@dataclass(frozen=True)
class _Venues:
    field: np.ndarray  # (V,) home field index
    uuid: pl.Series
    name: pl.Series
    s2: pl.DataFrame  # the publication-venues records
    sources: pa.StructArray  # (V + repositories,) primary_location.source records
    citedness: np.ndarray  # (V + repositories,) 2-year mean citedness

    def by_field(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Venue indices sorted by home field, each field's start in them, and its count."""
        order = np.argsort(self.field, kind="stable")
        start = np.searchsorted(self.field[order], np.arange(len(FIELD_IDS)))
        return order, start, np.bincount(self.field, minlength=len(FIELD_IDS))


def _issn(number: int) -> str:
    digits = f"{number:07d}"
    check = (11 - sum(int(d) * w for d, w in zip(digits, range(8, 1, -1))) % 11) % 11
    return f"{digits[:4]}-{digits[4:]}{'X' if check == 10 else check}"


def _uuids(rng: np.random.Generator, n: int) -> list[str]:
    raw = np.frombuffer(rng.bytes(16 * n), np.uint8).reshape(n, 16).copy()
    raw[:, 6] = raw[:, 6] & 0x0F | 0x40  # version 4
    raw[:, 8] = raw[:, 8] & 0x3F | 0x80  # RFC 4122 variant
    hexes = [r.tobytes().hex() for r in raw]
    return [f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}" for h in hexes]


def _venues(rng: np.random.Generator, tax: _Taxonomy, n_venues: int) -> _Venues:
    n_fields = len(FIELD_IDS)
    field = np.concatenate(
        [
            np.arange(n_fields),  # every field has a venue
            rng.choice(n_fields, n_venues - n_fields, p=tax.field_weight),
        ]
    )
    conf_share = np.array([_CONFERENCE_SHARE.get(f, 0.03) for f in FIELD_IDS])[field]
    conference = rng.random(n_venues) < conf_share
    pairs = [
        tuple(tax.words[f][i].capitalize() for i in rng.choice(_WORDS_PER_FIELD, 2, replace=False))
        for f in field
    ]
    templates = [_CONFERENCE_NAMES if c else _JOURNAL_NAMES for c in conference]
    names = [t[rng.integers(len(t))].format(A=a, B=b) for t, (a, b) in zip(templates, pairs)]
    numbers = rng.choice(10_000_000, 2 * n_venues, replace=False)
    print_issn = [_issn(n) for n in numbers[:n_venues]]
    e_issn = [
        _issn(n) if has else None for n, has in zip(numbers[n_venues:], rng.random(n_venues) < 0.7)
    ]
    u = rng.random((n_venues, 4))
    s2_issn = [e if e and x < 0.3 else p for p, e, x in zip(print_issn, e_issn, u[:, 0])]
    uuid = _uuids(rng, n_venues)
    s2 = pl.DataFrame(
        {
            "id": uuid,
            "alternate_issns": [
                [e] if e and s == p and x < 0.3 else []
                for p, e, s, x in zip(print_issn, e_issn, s2_issn, u[:, 1])
            ],
            "alternate_names": [[f"{a[:4]}. {b[:4]}."] for a, b in pairs],
            "alternate_urls": _constant([], pl.List(pl.String), n_venues),
            "issn": s2_issn,
            "name": names,
            "type": [
                None if x < 0.25 else ("conference" if c else "journal")
                for c, x in zip(conference, u[:, 2])
            ],
            "url": [
                f"https://www.{a.lower()}{b.lower()}.org/" if x < 0.6 else None
                for (a, b), x in zip(pairs, u[:, 3])
            ],
        }
    )
    n_repos = max(2, n_venues // 20)
    repo_names = [
        f"{tax.words[f][0].capitalize()} Institutional Repository"
        for f in rng.choice(n_fields, n_repos)
    ]
    types = ["conference" if c else "journal" for c in conference] + ["repository"] * n_repos
    sources = pa.StructArray.from_arrays(
        [
            pa.array(
                [f"https://openalex.org/S{SOURCE_ID_BASE + s}" for s in range(n_venues + n_repos)]
            ),
            pa.array(names + repo_names),
            pa.array(types),
            pa.array(print_issn + [None] * n_repos),
            pa.array(
                [[p, e] if e else [p] for p, e in zip(print_issn, e_issn)] + [None] * n_repos,
                pa.list_(pa.string()),
            ),
        ],
        names=["id", "display_name", "type", "issn_l", "issn"],
    )
    mean_log = np.concatenate([np.where(conference, -0.7, 0.5), np.full(n_repos, -2.0)])
    citedness = np.round(rng.lognormal(mean_log, 0.8), 3)
    return _Venues(
        field=field,
        uuid=pl.Series(uuid),
        name=pl.Series(names),
        s2=s2,
        sources=sources,
        citedness=citedness,
    )


# ---------------------------------------------------------------- papers and works


@dataclass(frozen=True)
class _Entities:
    """Columns over all entities: papers first (index < n_papers), then works without a paper."""

    n_papers: int
    join: np.ndarray  # join class (DOI, MAG_ONLY, ...)
    corpusid: np.ndarray  # -1 for works without a paper
    work: np.ndarray  # W number (for S2-only papers: the MAG id no work carries)
    topics: np.ndarray  # (n, 3) topic index, -1 where absent
    scores: np.ndarray  # (n, 3)
    year: np.ndarray
    day: np.ndarray  # day of the year, 0-based
    date_known: np.ndarray  # S2 publicationdate present (OpenAlex falls back to 1 January)
    venue: np.ndarray
    venue_id_known: np.ndarray  # S2 publicationvenueid present
    venue_text_known: np.ndarray  # S2 venue text present
    source: np.ndarray  # OpenAlex source index, -1 for none
    doi: np.ndarray  # has a DOI (on every side it exists on)
    doi_upper: np.ndarray  # S2 writes it upper-case
    mag: np.ndarray
    pmid: np.ndarray
    arxiv: np.ndarray
    oa_status: np.ndarray  # index into _OA_STATUSES
    license: np.ndarray  # index into _LICENSES
    title_words: np.ndarray  # (n, 2) word index within the field
    conjunction: np.ndarray
    sentences: np.ndarray  # (n, 5) sentence index within the field
    n_sentences: np.ndarray
    has_abstract: np.ndarray

    @property
    def field(self) -> np.ndarray:
        return self.topics[:, 0] // TOPICS_PER_FIELD


def _join_classes(rng: np.random.Generator, n_papers: int, overlap: float) -> np.ndarray:
    n_matched = round(n_papers * overlap)
    n_oa_only = round(n_matched * _OA_ONLY_SHARE / (1 - _OA_ONLY_SHARE))
    join = np.full(n_papers + n_oa_only, OA_ONLY, np.int8)
    join[:n_papers] = S2_ONLY
    join[rng.permutation(n_papers)[:n_matched]] = rng.choice(
        [DOI, MAG_ONLY, PUBMED_ONLY], n_matched, p=_MATCH_SHARES
    )
    return join


def _topic_draws(rng: np.random.Generator, tax: _Taxonomy, n: int) -> tuple[np.ndarray, np.ndarray]:
    """1-3 distinct topics per entity: the rest mostly in the first's subfield or field."""
    n_fields = len(FIELD_IDS)
    sub_w = 1 / np.arange(1, SUBFIELDS_PER_FIELD + 1) ** 0.8
    top_w = 1 / np.arange(1, TOPICS_PER_SUBFIELD + 1) ** 0.7
    field = rng.choice(n_fields, n, p=tax.field_weight)
    sub = rng.choice(SUBFIELDS_PER_FIELD, n, p=sub_w / sub_w.sum())
    top = rng.choice(TOPICS_PER_SUBFIELD, n, p=top_w / top_w.sum())
    topics = np.full((n, 3), -1, np.int64)
    topics[:, 0] = field * TOPICS_PER_FIELD + sub * TOPICS_PER_SUBFIELD + top
    for slot in (1, 2):
        u = rng.random(n)
        other_top = (top + rng.integers(1, TOPICS_PER_SUBFIELD, n)) % TOPICS_PER_SUBFIELD
        other_sub = (sub + rng.integers(1, SUBFIELDS_PER_FIELD, n)) % SUBFIELDS_PER_FIELD
        other_field = (field + rng.integers(1, n_fields, n)) % n_fields
        f = np.where(u < 0.85, field, other_field)
        s = np.where(u < 0.55, sub, other_sub)
        t = np.where(u < 0.55, other_top, rng.integers(0, TOPICS_PER_SUBFIELD, n))
        topics[:, slot] = f * TOPICS_PER_FIELD + s * TOPICS_PER_SUBFIELD + t
    n_topics = rng.choice([1, 2, 3], n, p=[0.1, 0.1, 0.8])
    n_topics[(n_topics == 3) & (topics[:, 2] == topics[:, 1])] = 2
    topics[np.arange(3) >= n_topics[:, None]] = -1
    scores = np.sort(rng.uniform(0.5, 1.0, (n, 3)), axis=1)[:, ::-1]
    return topics, np.round(np.where(topics >= 0, scores, 0.0), 4)


def _entities(
    rng: np.random.Generator, tax: _Taxonomy, venues: _Venues, n_papers: int, overlap: float
) -> _Entities:
    join = _join_classes(rng, n_papers, overlap)
    n = len(join)
    index = np.arange(n)
    is_paper = index < n_papers
    corpusid = np.where(is_paper, CORPUS_ID_BASE + 3 * index + rng.integers(0, 3, n), -1)
    work = np.where(is_paper, WORK_ID_OFFSET + corpusid, OA_ONLY_WORK_BASE + index - n_papers)
    topics, scores = _topic_draws(rng, tax, n)
    field = topics[:, 0] // TOPICS_PER_FIELD
    year_w = np.exp(0.09 * (_YEARS - _YEARS[0]))
    order, start, count = venues.by_field()
    home = order[start[field] + (rng.random(n) * count[field]).astype(np.int64)]
    venue = np.where(rng.random(n) < _HOME_VENUE_SHARE, home, rng.integers(0, len(venues.field), n))
    n_repos = len(venues.sources) - len(venues.field)
    repository = len(venues.field) + rng.integers(0, n_repos, n)
    u = rng.random((n, 12))
    source = np.where(
        u[:, 0] < 0.1, -1, np.where((join == OA_ONLY) & (u[:, 1] < 0.3), repository, venue)
    )
    life = np.isin(np.array([FIELDS[f][1] for f in FIELD_IDS])[field], [1, 4])
    unmatched = (join == S2_ONLY) | (join == OA_ONLY)
    oa_status = np.where(u[:, 2] < 0.35, rng.integers(1, len(_OA_STATUSES), n), 0)
    return _Entities(
        n_papers=n_papers,
        join=join,
        corpusid=corpusid,
        work=work,
        topics=topics,
        scores=scores,
        year=rng.choice(_YEARS, n, p=year_w / year_w.sum()),
        day=rng.integers(0, 365, n),
        date_known=u[:, 3] >= 0.15,
        venue=venue,
        venue_id_known=u[:, 4] < 0.75,
        venue_text_known=u[:, 5] < 0.85,
        source=source,
        doi=(join == DOI) | (unmatched & (u[:, 6] < 0.65)),
        doi_upper=u[:, 7] < _UPPER_DOI_SHARE,
        mag=(join == MAG_ONLY) | (((join == DOI) | unmatched) & (u[:, 8] < 0.6)),
        pmid=(join == PUBMED_ONLY) | (((join == DOI) | unmatched) & life & (u[:, 9] < 0.6)),
        arxiv=np.isin(FIELD_IDS[field], [17, 26, 31]) & (u[:, 10] < 0.3),
        oa_status=oa_status,
        license=np.where(
            oa_status > 0,
            rng.choice(len(_LICENSES), n, p=[0.45, 0.15, 0.05, 0.05, 0.30]),
            len(_LICENSES) - 1,
        ),
        title_words=rng.integers(0, _WORDS_PER_FIELD, (n, 2)),
        conjunction=rng.integers(0, len(_CONJUNCTIONS), n),
        sentences=rng.integers(0, _SENTENCES_PER_FIELD, (n, 5)),
        n_sentences=rng.integers(3, 6, n),
        has_abstract=is_paper & (u[:, 11] < _ABSTRACT_SHARE),
    )


# ---------------------------------------------------------------- citations


@dataclass(frozen=True)
class _Citations:
    citing: np.ndarray  # paper index
    cited: np.ndarray  # paper index, -1 when unresolved
    n_contexts: np.ndarray
    intents: np.ndarray  # index into _INTENT_SETS; len(_INTENT_SETS) for none
    influential: np.ndarray


def _recent(window: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A position in [0, window), biased toward the end (recent papers)."""
    return np.minimum((window * rng.random(len(window)) ** 0.5).astype(np.int64), window - 1)


def _weighted(
    cum_weight: np.ndarray, lo: np.ndarray, window: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """A position in [0, window) after `lo`, drawn by the weights summed up in `cum_weight`."""
    a, b = cum_weight[lo], cum_weight[lo + window]
    at = np.searchsorted(cum_weight, a + rng.random(len(lo)) * (b - a), side="right") - 1
    return np.clip(at - lo, 0, window - 1)


@dataclass(frozen=True)
class _Ranking:
    """Papers sorted by date within groups (fields, or one group of all), to draw for a citing
    paper an earlier paper of a group: a recent one, or one drawn by fitness."""

    order: np.ndarray  # paper indices sorted by (group, date)
    start: np.ndarray  # per group, its first position in order
    size: np.ndarray  # per group
    rank: np.ndarray  # per paper, its position within its own group
    cum_fitness: np.ndarray  # running sum of fitness along order, from 0

    @classmethod
    def of(
        cls, group: np.ndarray, n_groups: int, date: np.ndarray, fitness: np.ndarray
    ) -> _Ranking:
        order = np.lexsort((date, group))
        start = np.searchsorted(group[order], np.arange(n_groups))
        rank = np.empty(len(group), np.int64)
        rank[order] = np.arange(len(group)) - start[group[order]]
        return cls(
            order=order,
            start=start,
            size=np.bincount(group, minlength=n_groups),
            rank=rank,
            cum_fitness=np.concatenate([[0.0], np.cumsum(fitness[order])]),
        )

    def earlier(
        self, rng: np.random.Generator, citing: np.ndarray, group: np.ndarray
    ) -> np.ndarray:
        """Per citing paper, a paper of `group` before it (when it is in that group and first,
        nothing is earlier: any paper of the group); half recent, half by fitness."""
        lo = self.start[group]
        window = np.where(self.rank[citing] > 0, self.rank[citing], self.size[group])
        by_fitness = rng.random(len(citing)) < 0.5
        at = np.empty(len(citing), np.int64)
        at[by_fitness] = _weighted(self.cum_fitness, lo[by_fitness], window[by_fitness], rng)
        at[~by_fitness] = _recent(window[~by_fitness], rng)
        return self.order[lo + at]


@dataclass(frozen=True)
class _CitationModel:
    """Who cites whom: how many references each paper makes (log-normal), how attractive each is
    to cite (log-normal fitness: the heavy tail of citation counts), in which field."""

    field: np.ndarray
    within_field: _Ranking
    overall: _Ranking
    out_weight: np.ndarray  # sums to 1

    @classmethod
    def of(cls, rng: np.random.Generator, field: np.ndarray, date: np.ndarray) -> _CitationModel:
        out_degree = rng.lognormal(0.0, 1.0, len(field))
        fitness = rng.lognormal(0.0, 1.5, len(field))
        return cls(
            field=field,
            within_field=_Ranking.of(field, len(FIELD_IDS), date, fitness),
            overall=_Ranking.of(np.zeros_like(field), 1, date, fitness),
            out_weight=out_degree / out_degree.sum(),
        )

    def draw(self, rng: np.random.Generator, k: int) -> tuple[np.ndarray, np.ndarray]:
        """`k` (citing, cited) pairs, cited -1 when unresolved: an earlier paper of the citing
        field, or of any field for the cross-field share."""
        citing = rng.choice(len(self.field), k, p=self.out_weight)
        cross = rng.random(k) < _CROSS_FIELD_CITATION
        cited = np.empty(k, np.int64)
        cited[~cross] = self.within_field.earlier(rng, citing[~cross], self.field[citing[~cross]])
        cited[cross] = self.overall.earlier(rng, citing[cross], np.zeros(cross.sum(), np.int64))
        cited[rng.random(k) < _UNRESOLVED_CITATION] = -1
        return citing, cited


def _distinct(citing: np.ndarray, cited: np.ndarray, n_papers: int) -> np.ndarray:
    """Positions of the first occurrence of each resolved pair and of every unresolved citation,
    in order; self-citations dropped."""
    resolved = np.flatnonzero((cited >= 0) & (cited != citing))
    _, first_seen = np.unique(citing[resolved] * n_papers + cited[resolved], return_index=True)
    keep = cited < 0
    keep[resolved[first_seen]] = True
    return np.flatnonzero(keep)


def _citations(rng: np.random.Generator, ent: _Entities, n_citations: int) -> _Citations:
    n = ent.n_papers
    model = _CitationModel.of(rng, ent.field[:n], ent.year[:n] * 366 + ent.day[:n])
    citing = cited = np.empty(0, np.int64)
    for _ in range(_CITATION_ROUNDS):  # a dense graph may need more draws to reach n_citations
        missing = n_citations - len(citing)
        if missing <= 0:
            break
        more_citing, more_cited = model.draw(rng, int(missing * 1.1) + 16)
        citing, cited = np.concatenate([citing, more_citing]), np.concatenate([cited, more_cited])
        rows = _distinct(citing, cited, n)
        citing, cited = citing[rows], cited[rows]
    citing, cited = citing[:n_citations], cited[:n_citations]
    m = len(citing)
    n_contexts = np.where(rng.random(m) < 0.6, rng.choice([1, 2, 3], m, p=[0.5, 0.3, 0.2]), 0)
    intents = np.where(
        (n_contexts > 0) & (rng.random(m) < 0.85),
        rng.choice(len(_INTENT_SETS), m, p=[0.55, 0.15, 0.08, 0.12, 0.10]),
        len(_INTENT_SETS),
    )
    return _Citations(
        citing=citing,
        cited=cited,
        n_contexts=n_contexts,
        intents=intents,
        influential=rng.random(m) < np.where(n_contexts > 1, 0.2, 0.05),
    )


# ---------------------------------------------------------------- columns shared by tables


def _constant(value: object, dtype: pl.DataType, n: int) -> pl.Series:
    return pl.select(pl.repeat(pl.lit(value, dtype=dtype), n)).to_series()


def _masked(values: pl.Series, keep: np.ndarray) -> pl.Series:
    """`values` where `keep`, else null."""
    return pl.select(pl.when(pl.Series(keep)).then(values)).to_series().alias(values.name)


def _concat(*parts: pl.Series | str) -> pl.Series:
    exprs = [
        pl.lit(p) if isinstance(p, str) else pl.lit(p).alias(f"p{i}") for i, p in enumerate(parts)
    ]
    return pl.select(pl.concat_str(exprs)).to_series()


def _text(values: np.ndarray) -> pl.Series:
    return pl.Series(values).cast(pl.String)


def _dates(year: np.ndarray, day: np.ndarray) -> pl.Series:
    return pl.Series((year - 1970).astype("datetime64[Y]").astype("datetime64[D]") + day)


def _dois(ent: _Entities, rows: np.ndarray) -> pl.Series:
    """Lower-case DOIs (null where none), unique per entity, under the venue's registrant."""
    suffix = pl.select(
        pl.when(pl.Series(ent.corpusid[rows] >= 0))
        .then(_text(ent.corpusid[rows]))
        .otherwise(_concat("w", _text(ent.work[rows])))
    ).to_series()
    doi = _concat(
        "10.",
        _text(5000 + ent.venue[rows]),
        "/",
        _field_abbreviations().gather(ent.field[rows]),
        ".",
        _text(ent.year[rows]),
        ".",
        suffix,
    )
    return _masked(doi, ent.doi[rows])


def _titles(tax: _Taxonomy, ent: _Entities, rows: np.ndarray) -> pl.Series:
    field = ent.field[rows]
    first, second = (
        tax.flat_words.gather(field * _WORDS_PER_FIELD + ent.title_words[rows, k]) for k in (0, 1)
    )
    return _concat(
        first.str.to_titlecase(),
        " ",
        second,
        " ",
        pl.Series(_CONJUNCTIONS).gather(ent.conjunction[rows]),
        " ",
        tax.topic_names.gather(ent.topics[rows, 0]).str.to_lowercase(),
    )


def _abstracts(tax: _Taxonomy, ent: _Entities, rows: np.ndarray) -> pl.Series:
    """'We study <topic>.' then 3-5 sentences of the entity's field, the same text for S2 and OA."""
    base = ent.field[rows] * _SENTENCES_PER_FIELD
    sentences = [
        _masked(
            tax.abstract_sentences.gather(base + ent.sentences[rows, k]), ent.n_sentences[rows] > k
        ).alias(f"s{k}")
        for k in range(5)
    ]
    opening = _concat(
        "We study ", tax.topic_names.gather(ent.topics[rows, 0]).str.to_lowercase(), "."
    )
    return pl.select(
        pl.concat_str([pl.lit(opening), *map(pl.lit, sentences)], separator=" ", ignore_nulls=True)
    ).to_series()


def _inverted_index(text: str) -> str:
    index: dict[str, list[int]] = {}
    for position, word in enumerate(text.split(" ")):
        index.setdefault(word, []).append(position)
    return json.dumps(index, ensure_ascii=False, separators=(",", ":"))


def _topic_structs(tax: _Taxonomy, topics: np.ndarray, scores: np.ndarray) -> pa.StructArray:
    base = tax.topics.take(pa.array(topics))
    return pa.StructArray.from_arrays(
        [
            base.field("id"),
            base.field("display_name"),
            pa.array(scores),
            base.field("subfield"),
            base.field("field"),
            base.field("domain"),
        ],
        names=["id", "display_name", "score", "subfield", "field", "domain"],
    )


def _topic_lists(tax: _Taxonomy, topics: np.ndarray, scores: np.ndarray) -> pl.Series:
    present = topics >= 0
    offsets = np.concatenate([[0], np.cumsum(present.sum(axis=1))]).astype(np.int32)
    return pl.from_arrow(
        pa.ListArray.from_arrays(
            pa.array(offsets), _topic_structs(tax, topics[present], scores[present])
        )
    )


# ---------------------------------------------------------------- tables


@dataclass(frozen=True)
class _World:
    tax: _Taxonomy
    venues: _Venues
    ent: _Entities
    cit: _Citations
    citation_count: np.ndarray  # per paper
    reference_count: np.ndarray
    influential_count: np.ndarray
    work_rows: np.ndarray  # entities with a work, in snapshot order
    s2_updated: pl.Series
    citation_updated: pl.Series
    oa_updated: pl.Series


def _external_ids(ent: _Entities, rows: np.ndarray) -> pl.DataFrame:
    """S2 `externalids` (all strings or null; DOIs upper-case for some papers, as S2 has them)."""
    corpusid = _text(ent.corpusid[rows])
    doi = _dois(ent, rows)
    arxiv = _concat(
        _text(ent.year[rows] % 100).str.zfill(2),
        _text(ent.day[rows] // 31 + 1).str.zfill(2),
        ".",
        _text(rows % 100_000).str.zfill(5),
    )
    computer_science = FIELD_IDS[ent.field[rows]] == 17
    return pl.DataFrame(
        {
            "ACL": _constant(None, pl.String, len(rows)),
            "DBLP": _masked(_concat("journals/syn/", corpusid), computer_science & ent.doi[rows]),
            "ArXiv": _masked(arxiv, ent.arxiv[rows]),
            "MAG": _masked(_text(ent.work[rows]), ent.mag[rows]),
            "CorpusId": corpusid,
            "PubMed": _masked(_text(PMID_BASE + rows), ent.pmid[rows]),
            "DOI": pl.select(
                pl.when(pl.Series(ent.doi_upper[rows])).then(doi.str.to_uppercase()).otherwise(doi)
            ).to_series(),
            "PubMedCentral": _masked(
                _text(PMID_BASE // 10 + rows), ent.pmid[rows] & (ent.oa_status[rows] > 0)
            ),
        }
    )


def _paper_records(w: _World, rows: np.ndarray, rng: np.random.Generator) -> pl.DataFrame:
    ent = w.ent
    return pl.DataFrame(
        {
            "corpusid": ent.corpusid[rows],
            "externalids": _external_ids(ent, rows).to_struct(),
            "title": _titles(w.tax, ent, rows),
            "venue": pl.select(
                pl.when(pl.Series(ent.venue_text_known[rows]))
                .then(w.venues.name.gather(ent.venue[rows]))
                .otherwise(pl.lit(""))
            ).to_series(),
            "publicationvenueid": _masked(
                w.venues.uuid.gather(ent.venue[rows]), ent.venue_id_known[rows]
            ),
            "year": ent.year[rows],
            "referencecount": w.reference_count[rows],
            "citationcount": w.citation_count[rows],
            "influentialcitationcount": w.influential_count[rows],
            "isopenaccess": ent.oa_status[rows] > 0,
            "s2fieldsofstudy": _constant(None, pl.Null, len(rows)),
            "publicationdate": _masked(_dates(ent.year[rows], ent.day[rows]), ent.date_known[rows]),
            "updated": w.s2_updated.gather(rng.integers(0, _TIMESTAMPS, len(rows))),
        }
    )


def _abstract_records(w: _World, rows: np.ndarray, rng: np.random.Generator) -> pl.DataFrame:
    ent = w.ent
    openaccessinfo = pl.DataFrame(
        {
            "externalids": _external_ids(ent, rows)
            .select("MAG", "ACL", "DOI", "PubMedCentral", "ArXiv")
            .to_struct(),
            "license": pl.Series(_LICENSES).gather(ent.license[rows]),
            "url": _masked(
                _concat("https://oa.example.org/pdf/", _text(ent.corpusid[rows]), ".pdf"),
                ent.oa_status[rows] > 0,
            ),
            "status": pl.Series(_OA_STATUSES).gather(ent.oa_status[rows]),
        }
    ).to_struct()
    return pl.DataFrame(
        {
            "corpusid": ent.corpusid[rows],
            "openaccessinfo": openaccessinfo,
            "abstract": _abstracts(w.tax, ent, rows),
            "updated": w.s2_updated.gather(rng.integers(0, _TIMESTAMPS, len(rows))),
        }
    )


def _citation_records(
    w: _World, rows: np.ndarray, rng: np.random.Generator, shard: int
) -> pl.DataFrame:
    """Even shards write ids as strings and empty lists as null (the 2022 export), odd ones ints
    and []."""
    old_style = shard % 2 == 0
    cit, ent = w.cit, w.ent
    citing, cited = cit.citing[rows], cit.cited[rows]
    n_contexts = cit.n_contexts[rows]
    about = ent.field[np.where(cited >= 0, cited, citing)]
    offsets = np.concatenate([[0], np.cumsum(n_contexts)]).astype(np.int32)
    picks = np.repeat(about, n_contexts) * _CONTEXTS_PER_FIELD + rng.integers(
        0, _CONTEXTS_PER_FIELD, offsets[-1]
    )
    contexts = pa.ListArray.from_arrays(
        pa.array(offsets),
        w.tax.context_sentences.take(pa.array(picks)),
        mask=pa.array(old_style & (n_contexts == 0)),
    )
    ids = [
        pl.Series(ent.corpusid[citing]),
        _masked(pl.Series(ent.corpusid[np.maximum(cited, 0)]), cited >= 0),
    ]
    if old_style:
        ids = [s.cast(pl.String) for s in ids]
    intent_sets = pl.Series([*_INTENT_SETS, None if old_style else []])
    return pl.DataFrame(
        {
            "citingcorpusid": ids[0],
            "citedcorpusid": ids[1],
            "isinfluential": cit.influential[rows],
            "contexts": pl.from_arrow(contexts),
            "intents": intent_sets.gather(cit.intents[rows]),
            "updated": w.citation_updated.gather(rng.integers(0, _TIMESTAMPS, len(rows))),
        }
    )


def _work_lines(w: _World, rows: np.ndarray, rng: np.random.Generator) -> pl.Series:
    ent = w.ent
    work_id = _concat("https://openalex.org/W", _text(ent.work[rows]))
    doi = _concat("https://doi.org/", _dois(ent, rows))
    title = _titles(w.tax, ent, rows)
    source = w.venues.sources.take(pa.array(ent.source[rows], mask=ent.source[rows] < 0))
    has_paper = ent.corpusid[rows] >= 0
    cited_by = np.where(
        has_paper, w.citation_count[np.where(has_paper, rows, 0)], rng.geometric(0.1, len(rows)) - 1
    )
    records = pl.DataFrame(
        {
            "id": work_id,
            "doi": doi,
            "ids": pl.DataFrame(
                {
                    "openalex": work_id,
                    "doi": doi,
                    "mag": _masked(_text(ent.work[rows]), ent.mag[rows]),
                    "pmid": _masked(
                        _concat("https://pubmed.ncbi.nlm.nih.gov/", _text(PMID_BASE + rows)),
                        ent.pmid[rows],
                    ),
                }
            ).to_struct(),
            "title": title,
            "display_name": title,
            "publication_year": ent.year[rows],
            "publication_date": _dates(
                ent.year[rows], np.where(ent.date_known[rows], ent.day[rows], 0)
            ),
            "type": _constant("article", pl.String, len(rows)),
            "primary_location": pl.DataFrame({"source": pl.from_arrow(source)}).to_struct(),
            "primary_topic": pl.from_arrow(
                _topic_structs(w.tax, ent.topics[rows, 0], ent.scores[rows, 0])
            ),
            "topics": _topic_lists(w.tax, ent.topics[rows], ent.scores[rows]),
            "referenced_works": _constant([], pl.List(pl.String), len(rows)),
            "cited_by_count": cited_by,
            "updated_date": w.oa_updated.gather(rng.integers(0, _TIMESTAMPS, len(rows))),
            "abstract_inverted_index": _constant(None, pl.Null, len(rows)),
        }
    )
    lines = _json_lines(records)
    with_index = np.flatnonzero(rng.random(len(rows)) < _INVERTED_INDEX_SHARE)
    if len(with_index):
        texts = _abstracts(w.tax, ent, rows[with_index]).to_list()
        heads = lines.gather(with_index).str.head(-len("null}")).to_list()
        lines.scatter(with_index, [h + _inverted_index(t) + "}" for h, t in zip(heads, texts)])
    return lines


def _source_records(w: _World) -> pl.DataFrame:
    sources = w.venues.sources
    has_work = w.ent.join != S2_ONLY
    works_count = np.bincount(w.ent.source[has_work & (w.ent.source >= 0)], minlength=len(sources))
    h_index = np.minimum(
        works_count, np.round(np.sqrt(works_count * w.venues.citedness) * 1.5)
    ).astype(np.int64)
    i10 = np.minimum(works_count, np.round(h_index * 2.5)).astype(np.int64)
    return pl.DataFrame(
        {
            **{
                name: pl.from_arrow(sources.field(name))
                for name in ("id", "display_name", "type", "issn_l", "issn")
            },
            "works_count": works_count,
            "summary_stats": pl.DataFrame(
                {"2yr_mean_citedness": w.venues.citedness, "h_index": h_index, "i10_index": i10}
            ).to_struct(),
        }
    )


# ---------------------------------------------------------------- writing


def _json_lines(records: pl.DataFrame) -> pl.Series:
    return records.select(pl.struct(pl.all()).struct.json_encode()).to_series()


def _corrupt(line: str, kind: int, table: _Table, rng: np.random.Generator) -> str:
    """A malformed line made from a valid one: truncated, garbage, without its id, with a bad id."""
    if kind == 0:
        return line[: int(rng.integers(1, len(line) - 1))]
    if kind == 1:
        return f"<html><body>502 Bad Gateway {int(rng.integers(1 << 40)):x}</body></html>"
    record = json.loads(line)
    if kind == 2:
        del record[table.id_key]
    else:
        record[table.id_key] = table.bad_id
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


def _with_malformed(
    lines: pl.Series, rate: float, table: _Table, rng: np.random.Generator
) -> tuple[pl.Series, int]:
    """`lines` with Binomial(len, rate) malformed lines inserted at random positions."""
    n = len(lines)
    k = int(rng.binomial(n, rate)) if n else 0
    if k == 0:
        return lines, 0
    bad = [
        _corrupt(lines[int(i)], int(kind), table, rng)
        for i, kind in zip(rng.integers(0, n, k), rng.integers(0, 4, k))
    ]
    order = np.insert(np.arange(n), np.sort(rng.integers(0, n + 1, k)), n + np.arange(k))
    return pl.concat([lines, pl.Series(bad)]).gather(order), k


def _write_lines(path: Path, lines: pl.Series) -> None:
    """Gzipped lines, published by rename so a partial file never has the final name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    pl.DataFrame({"line": lines}).write_csv(
        partial,
        include_header=False,
        quote_style="never",
        compression="gzip",
        compression_level=1,
        check_extension=False,
    )
    partial.replace(path)


def _write_table(
    out: Path,
    table: _Table,
    rows: np.ndarray,
    n_shards: int,
    lines_of: Callable[[np.ndarray, np.random.Generator, int], pl.Series],
    seed: int,
    malformed_rate: float,
) -> int:
    """Writes `rows` in `n_shards` shards, each with its own random stream; returns the number of
    malformed lines."""
    malformed = 0
    for shard, shard_rows in enumerate(np.array_split(rows, n_shards)):
        rng = np.random.default_rng([seed, _TABLES.index(table), shard])
        lines, bad = _with_malformed(lines_of(shard_rows, rng, shard), malformed_rate, table, rng)
        _write_lines(out / table.pattern.format(shard=shard), lines)
        malformed += bad
    return malformed


def _world(seed: int, n_papers: int, n_citations: int, overlap: float) -> _World:
    rng = np.random.default_rng(seed)
    tax = _taxonomy()
    venues = _venues(rng, tax, max(_MIN_VENUES, n_papers // _PAPERS_PER_VENUE))
    ent = _entities(rng, tax, venues, n_papers, overlap)
    cit = _citations(rng, ent, n_citations)
    resolved = cit.cited >= 0
    return _World(
        tax=tax,
        venues=venues,
        ent=ent,
        cit=cit,
        citation_count=np.bincount(cit.cited[resolved], minlength=n_papers),
        reference_count=np.bincount(cit.citing, minlength=n_papers),
        influential_count=np.bincount(cit.cited[resolved & cit.influential], minlength=n_papers),
        work_rows=rng.permutation(np.flatnonzero(ent.join != S2_ONLY)),
        s2_updated=_timestamps(rng, "2022-01-20", 10, "ms", "Z"),
        citation_updated=_timestamps(rng, "2020-03-01", 300, "ms", "Z"),
        oa_updated=_timestamps(rng, SNAPSHOT_DATE, 1, "us", ""),
    )


def generate(
    out_dir: str | os.PathLike,
    n_papers: int,
    n_citations: int,
    *,
    seed: int = 0,
    n_shards: int = 4,
    malformed_rate: float = 0.001,
    overlap: float = 0.9,
) -> SyntheticStats:
    """Writes the synthetic S2 and OpenAlex dumps under `out_dir` (layout and ground truth in the
    module docstring); the same arguments always give the same bytes."""
    if n_papers < 1:
        raise ValueError(f"n_papers must be at least 1, got {n_papers}")
    if n_citations < 0:
        raise ValueError(f"n_citations must be at least 0, got {n_citations}")
    if n_shards < 1:
        raise ValueError(f"n_shards must be at least 1, got {n_shards}")
    if not 0 <= malformed_rate < 1:
        raise ValueError(f"malformed_rate must be in [0, 1), got {malformed_rate}")
    if not 0 <= overlap <= 1:
        raise ValueError(f"overlap must be in [0, 1], got {overlap}")
    out = Path(out_dir)
    w = _world(seed, n_papers, n_citations, overlap)
    ent = w.ent
    papers = np.arange(n_papers)
    abstracts = np.flatnonzero(ent.has_abstract)
    works = w.work_rows
    citations = np.arange(len(w.cit.citing))

    def write(
        table: _Table,
        rows: np.ndarray,
        shards: int,
        rate: float,
        lines_of: Callable[[np.ndarray, np.random.Generator, int], pl.Series],
    ) -> int:
        return _write_table(out, table, rows, shards, lines_of, seed, rate)

    malformed = {
        _PAPERS.name: write(
            _PAPERS,
            papers,
            n_shards,
            malformed_rate,
            lambda r, g, _: _json_lines(_paper_records(w, r, g)),
        ),
        _ABSTRACTS.name: write(
            _ABSTRACTS,
            abstracts,
            n_shards,
            malformed_rate,
            lambda r, g, _: _json_lines(_abstract_records(w, r, g)),
        ),
        _CITATIONS.name: write(
            _CITATIONS,
            citations,
            n_shards,
            malformed_rate,
            lambda r, g, s: _json_lines(_citation_records(w, r, g, s)),
        ),
        _VENUES.name: write(
            _VENUES,
            np.arange(len(w.venues.s2)),
            1,
            malformed_rate,
            lambda r, g, _: _json_lines(w.venues.s2[r]),
        ),
        _WORKS.name: write(
            _WORKS, works, n_shards, malformed_rate, lambda r, g, _: _work_lines(w, r, g)
        ),
    }
    write(
        _SOURCES,
        np.arange(len(w.venues.sources)),
        1,
        0.0,
        lambda r, g, _: _json_lines(_source_records(w)),
    )
    return SyntheticStats(
        papers=n_papers,
        abstracts=len(abstracts),
        citations=len(citations),
        venues=len(w.venues.s2),
        works=len(works),
        sources=len(w.venues.sources),
        malformed=malformed,
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m cpr_ray.sample.synthetic",
        description="Write a synthetic S2 + OpenAlex raw corpus.",
    )
    parser.add_argument("out", help="output directory")
    parser.add_argument("--papers", type=int, required=True, help="number of S2 papers")
    parser.add_argument("--citations", type=int, required=True, help="number of S2 citation rows")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shards", type=int, default=4, help="shards per big table")
    parser.add_argument("--malformed-rate", type=float, default=0.001)
    parser.add_argument(
        "--overlap", type=float, default=0.9, help="share of S2 papers with an OpenAlex work"
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    stats = generate(
        args.out,
        args.papers,
        args.citations,
        seed=args.seed,
        n_shards=args.shards,
        malformed_rate=args.malformed_rate,
        overlap=args.overlap,
    )
    print(json.dumps({**asdict(stats), "seconds": round(time.perf_counter() - started, 1)}))


if __name__ == "__main__":
    main()
