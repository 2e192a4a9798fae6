"""A small corpus in the export's format for the search tests: four fields, each writing about its
own things, years spread over three decades, so field filters and field inference have
something to find and a date filter cuts a known set."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cpr_ray.dataset.format import CORPUS

FIELDS = {
    "Computer Science": (
        "Physical Sciences",
        "neural network gradient training dataset "
        "classifier algorithm graph compiler software benchmark",
    ),
    "Physics and Astronomy": (
        "Physical Sciences",
        "quantum entropy particle thermodynamics "
        "lattice spin magnetic galaxy diffusion equilibrium",
    ),
    "Biochemistry, Genetics and Molecular Biology": (
        "Life Sciences",
        "protein gene cell enzyme genome sequencing mutation expression folding tissue",
    ),
    "Economics, Econometrics and Finance": (
        "Social Sciences",
        "market price inflation auction labor trade monetary demand portfolio policy",
    ),
}


def papers(n: int, seed: int = 0, start_id: int = 1000) -> list[dict]:
    rng = np.random.default_rng(seed)
    names = list(FIELDS)
    rows = []
    for i in range(n):
        field = names[i % len(names)]
        domain, vocab = FIELDS[field]
        words = vocab.split()
        title = " ".join(rng.choice(words, 4, replace=False)).capitalize()
        abstract = "We study " + " and ".join(rng.choice(words, 6)) + f" in setting {i}."
        year = int(1990 + (i * 7) % 35)
        rows.append(
            {
                "corpus_id": start_id + i * 3,
                "title": title,
                "abstract": abstract if i % 9 else None,  # some licences withhold it
                "abstract_license": "CC-BY" if i % 9 else None,
                "year": year,
                "publication_date": None,
                "topics": [
                    {
                        "id": names.index(field),
                        "name": f"{field} topic",
                        "score": 0.9,
                        "subfield_id": 1,
                        "field_id": names.index(field),
                        "domain_id": 1,
                    }
                ],
                "field": field,
                "domain": domain,
            }
        )
    return rows


def write_export(root: Path, rows: list[dict]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=CORPUS), root / "corpus.parquet")
    return root


def build_search_index(tmp: Path, rows: list[dict], model: str) -> Path:
    """`rows` exported under `tmp` and indexed with `model` at `tmp/idx`: what `cpr serve` and
    `cpr search` open."""
    from cpr_ray.config import load_config
    from cpr_ray.search.sharded_index import build_index

    export = write_export(tmp / "export", rows)
    flags = {"search.corpus": str(export), "search.out": str(tmp / "idx"), "encoder.model": model}
    build_index(load_config(flags=flags))
    return tmp / "idx"
