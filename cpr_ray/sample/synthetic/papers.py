"""Papers and works: which S2 papers have an OpenAlex work and by which id they join, their
venues, years and topics."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cpr_ray.corpus.taxonomy import FIELDS
from cpr_ray.sample.synthetic.design import (
    _ABSTRACT_SHARE,
    _CONJUNCTIONS,
    _HOME_VENUE_SHARE,
    _LICENSES,
    _MATCH_SHARES,
    _OA_ONLY_SHARE,
    _OA_STATUSES,
    _SENTENCES_PER_FIELD,
    _UPPER_DOI_SHARE,
    _WORDS_PER_FIELD,
    _YEARS,
    CORPUS_ID_BASE,
    DOI,
    FIELD_IDS,
    MAG_ONLY,
    OA_ONLY,
    OA_ONLY_WORK_BASE,
    PUBMED_ONLY,
    S2_ONLY,
    SUBFIELDS_PER_FIELD,
    TOPICS_PER_FIELD,
    TOPICS_PER_SUBFIELD,
    WORK_ID_OFFSET,
)
from cpr_ray.sample.synthetic.topics_and_text import _Taxonomy
from cpr_ray.sample.synthetic.venues import _Venues


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
