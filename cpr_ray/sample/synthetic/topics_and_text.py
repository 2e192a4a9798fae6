"""Taxonomy and text: the topic hierarchy (the same names for every seed), pseudo-words and
sentences per field, and the timestamps records carry."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Literal

import numpy as np
import polars as pl
import pyarrow as pa

from cpr_ray.corpus.taxonomy import DOMAINS, FIELDS, field_name
from cpr_ray.sample.synthetic.design import (
    _ABSTRACT_TEMPLATES,
    _CONTEXT_TEMPLATES,
    _CONTEXTS_PER_FIELD,
    _SENTENCES_PER_FIELD,
    _TAXONOMY_SEED,
    _TIMESTAMPS,
    _WORDS_PER_FIELD,
    FIELD_IDS,
    SUBFIELDS_PER_FIELD,
    TOPIC_ID_BASE,
    TOPICS_PER_FIELD,
    TOPICS_PER_SUBFIELD,
)


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


def _node(kind: str, ids: Iterable[int], names: Sequence[str]) -> pa.StructArray:
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
    rng: np.random.Generator, start: str, days: int, unit: Literal["ms", "us"], suffix: str
) -> pl.Series:
    """A pool of ISO timestamps in [start, start + days); tables draw rows from it."""
    ticks = rng.integers(0, days * 86_400 * (1000 if unit == "ms" else 1_000_000), _TIMESTAMPS)
    stamps = np.datetime64(start, unit) + ticks.astype(f"timedelta64[{unit}]")
    return pl.Series([s + suffix for s in np.datetime_as_string(stamps, unit=unit)])
