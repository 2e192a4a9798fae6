"""The records of each table in the real exports' shapes: S2 papers, abstracts, citations and
venues, OpenAlex works and sources, and the columns they derive from the world."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

from cpr_ray.sample.synthetic.citations import _Citations
from cpr_ray.sample.synthetic.column_helpers import (
    _concat,
    _constant,
    _dates,
    _json_lines,
    _masked,
    _text,
)
from cpr_ray.sample.synthetic.design import (
    _CONJUNCTIONS,
    _CONTEXTS_PER_FIELD,
    _INTENT_SETS,
    _INVERTED_INDEX_SHARE,
    _LICENSES,
    _OA_STATUSES,
    _SENTENCES_PER_FIELD,
    _TIMESTAMPS,
    _WORDS_PER_FIELD,
    FIELD_IDS,
    PMID_BASE,
    S2_ONLY,
)
from cpr_ray.sample.synthetic.papers import _Entities
from cpr_ray.sample.synthetic.topics_and_text import _field_abbreviations, _Taxonomy
from cpr_ray.sample.synthetic.venues import _Venues


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
    lists = pl.from_arrow(
        pa.ListArray.from_arrays(
            pa.array(offsets), _topic_structs(tax, topics[present], scores[present])
        )
    )
    assert isinstance(lists, pl.Series)  # from an Arrow array, not a table
    return lists


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
