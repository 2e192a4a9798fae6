"""Diff records → changed corpus rows: the pure functions the refresh applies (no Ray)."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

from cpr_ray.corpus import updates
from cpr_ray.corpus.apply_diffs import record_schema
from cpr_ray.corpus.parsing import ParseWorks, rows_schema
from cpr_ray.corpus.records import SPECS
from cpr_ray.corpus.shards import LINES
from cpr_ray.tables import schemas


def records(name: str, *rows: dict) -> pa.Table:
    schema = record_schema(name)
    return pa.Table.from_pylist(
        [{f.name: r.get(f.name) for f in schema} for r in rows], schema=schema
    )


def corpus_rows(*rows: dict) -> pa.Table:
    return pa.Table.from_pylist(
        [{f.name: r.get(f.name) for f in schemas.PAPERS} for r in rows], schema=schemas.PAPERS
    )


NOW = dt.datetime(2026, 12, 2)
CURRENT = corpus_rows(
    {
        "corpus_id": 1,
        "title": "Old title",
        "year": 2020,
        "doi": "10.1/a",
        "abstract": "An S2 abstract.",
        "abstract_license": "CCBY",
        "abstract_source": "s2",
        "abstract_length": 15,
    },
    {
        "corpus_id": 2,
        "title": "Second",
        "year": 2019,
        "abstract": "Kept",
        "abstract_source": "s2",
        "abstract_length": 4,
    },
)
# no OpenAlex key rows: these papers link to nothing (their topics stay empty)
NO_WORKS = rows_schema(ParseWorks(SPECS["works"], 4, 100)(LINES.empty_table()).schema).empty_table()


def rebuild(papers: pa.Table, abstracts: pa.Table, current: pa.Table, relink=()) -> dict:
    p, a = updates.rebuild_inputs(papers, abstracts, current, pa.array(relink, pa.int64()))
    rows = updates.rebuilt_papers(p, a, NO_WORKS, 4)
    return {r["corpus_id"]: r for r in rows.to_pylist()}


def test_a_metadata_change_keeps_the_papers_s2_abstract():
    new = records("papers", {"corpus_id": 1, "title": "New title", "year": 2020, "updated": NOW})
    out = rebuild(new, records("abstracts"), CURRENT)
    assert set(out) == {1}
    assert (out[1]["title"], out[1]["abstract"], out[1]["abstract_license"]) == (
        "New title",
        "An S2 abstract.",
        "CCBY",
    )


def test_an_abstract_only_change_keeps_the_papers_metadata_and_a_stray_abstract_makes_nothing():
    new = records(
        "abstracts",
        {"corpus_id": 2, "abstract": "Rewritten.", "license": "cc-by", "updated": NOW},
        {"corpus_id": 99, "abstract": "No such paper", "updated": NOW},
    )
    out = rebuild(records("papers"), new, CURRENT)
    assert set(out) == {2}
    assert (out[2]["title"], out[2]["abstract"], out[2]["abstract_license"]) == (
        "Second",
        "Rewritten.",
        "CCBY",
    )


def test_rebuilding_from_the_rebuilt_rows_changes_nothing():
    """A step applied twice (a killed refresh, rerun) gives the rows it gave once."""
    new = records("papers", {"corpus_id": 1, "title": "New title", "year": 2020, "updated": NOW})
    once = rebuild(new, records("abstracts"), CURRENT)
    twice = rebuild(new, records("abstracts"), corpus_rows(*once.values()))
    assert once == twice


def test_a_deleted_abstract_is_forgotten_and_the_rest_kept():
    current = updates.forget_abstracts(CURRENT, pa.array([1], pa.int64()))
    out = rebuild(records("papers"), records("abstracts"), current, relink=[1, 2])
    assert out[1]["abstract"] is None and out[1]["abstract_length"] == 0
    assert out[2]["abstract"] == "Kept"


def test_a_citation_record_without_sentences_keeps_the_s2orc_ones_recovered_before():
    current = pa.Table.from_pylist(
        [
            {
                "citing_id": 1,
                "cited_id": 2,
                "contexts": ["recovered"],
                "context_source": "s2orc",
                "intents": [],
                "is_influential": False,
            }
        ],
        schema=schemas.CITATIONS,
    )
    new = records(
        "citations",
        {"citing_id": 1, "cited_id": 2, "contexts": [], "is_influential": True, "updated": NOW},
        {"citing_id": 1, "cited_id": 3, "contexts": ["S2's own"], "updated": NOW},
    )
    empty = pa.table(
        {
            "citing_id": pa.array([], pa.int64()),
            "cited_id": pa.array([], pa.int64()),
            "sentences": pa.array([], pa.list_(pa.string())),
        }
    )
    rows = {
        (r["citing_id"], r["cited_id"]): r
        for r in updates.changed_citations(new, current, empty).to_pylist()
    }
    assert rows[(1, 2)]["contexts"] == ["recovered"] and rows[(1, 2)]["is_influential"]
    assert (rows[(1, 3)]["contexts"], rows[(1, 3)]["context_source"]) == (["S2's own"], "s2")
