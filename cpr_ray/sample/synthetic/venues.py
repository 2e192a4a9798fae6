"""Venues: S2 publication venues and OpenAlex sources sharing ISSNs, journals and conferences
per field."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

from cpr_ray.sample.synthetic.column_helpers import _constant
from cpr_ray.sample.synthetic.design import (
    _CONFERENCE_NAMES,
    _CONFERENCE_SHARE,
    _JOURNAL_NAMES,
    _WORDS_PER_FIELD,
    FIELD_IDS,
    SOURCE_ID_BASE,
)
from cpr_ray.sample.synthetic.topics_and_text import _Taxonomy


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
