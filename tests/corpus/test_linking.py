"""Linking S2 papers to OpenAlex works by DOI, then MAG, then PubMed, on records sharing ids."""

import json

import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.corpus import linking, records
from cpr_ray.tables.buckets import SKIPPED

N = 4


def _parse(spec, rows):
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    return records.parse_lines(pa.table({"text": lines, "path": ["t"] * len(lines)}), spec, N)


def _topic(tid, field, domain):
    return {
        "id": f"https://openalex.org/T{tid}",
        "display_name": f"topic {tid}",
        "score": 0.9,
        "subfield": {"id": f"https://openalex.org/subfields/{field}01", "display_name": "sf"},
        "field": {"id": f"https://openalex.org/fields/{field}", "display_name": f"field {field}"},
        "domain": {"id": f"https://openalex.org/domains/{domain}", "display_name": f"dom {domain}"},
    }


def _work(wid, doi=None, mag=None, pmid=None, field=17, updated="2026-01-01", source=None):
    return {
        "id": f"https://openalex.org/W{wid}",
        "doi": f"https://doi.org/{doi}" if doi else None,
        "ids": {"mag": mag, "pmid": f"https://pubmed.ncbi.nlm.nih.gov/{pmid}" if pmid else None},
        "publication_date": "2019-05-01",
        "primary_location": {
            "source": {"id": f"https://openalex.org/S{source}"} if source else None,
            "license": "cc-by",
        },
        "topics": [_topic(wid % 1000, field, 3)],
        "abstract_inverted_index": {"openalex": [0], "abstract": [1]},
        "updated_date": updated,
    }


def _paper(cid, doi=None, mag=None, pmid=None, updated="2026-01-01", title=None):
    return {
        "corpusid": cid,
        "title": title or f"paper {cid}",
        "year": 2019,
        "externalids": {"DOI": doi, "MAG": mag, "PubMed": pmid},
        "updated": updated,
    }


def _link(papers, works, abstracts=()):
    p = _parse(records.S2_PAPERS, papers)
    w = linking.work_keys(_parse(records.OPENALEX_WORKS, works), N)
    s2k = linking.s2_keys(p.filter(pc.greater_equal(p["_bucket"], 0)), N)
    matches = pa.concat_tables(
        linking.match_keys(
            s2k.filter(pc.equal(s2k["_bucket"], k)), w.filter(pc.equal(w["_bucket"], k)), N
        )
        for k in range(N)
    )
    a = _parse(records.S2_ABSTRACTS, abstracts) if abstracts else _parse(records.S2_ABSTRACTS, [])
    out = linking.assemble_papers(p, a, matches)
    return {r["corpus_id"]: r for r in out.to_pylist()}


def test_each_key_links_and_priority_is_doi_then_mag_then_pubmed():
    papers = [
        _paper(1, doi="10.5/ABC"),  # DOI, different case and prefix on the OpenAlex side
        _paper(2, mag="777"),
        _paper(3, pmid="31415"),
        _paper(4, doi="10.5/zzz", mag="888"),  # DOI → work 40, MAG → work 41: DOI wins
        _paper(5, doi="10.5/none"),  # no work
    ]
    works = [
        _work(10, doi="10.5/abc"),
        _work(20, mag="777"),
        _work(30, pmid="31415"),
        _work(40, doi="10.5/zzz", field=26),
        _work(41, mag="888", field=31),
    ]
    out = _link(papers, works)
    assert {c: (r["openalex_id"], r["join_key"]) for c, r in out.items()} == {
        1: (10, "doi"),
        2: (20, "mag"),
        3: (30, "pmid"),
        4: (40, "doi"),
        5: (None, None),
    }
    assert out[4]["field_id"] == 26 and out[4]["domain_id"] == 3
    assert out[5]["topics"] is None and out[5]["field_id"] is None


def test_s2_abstract_wins_openalex_fills_in_with_normalised_licence():
    papers = [_paper(1, doi="10.1/a"), _paper(2, doi="10.1/b")]
    works = [_work(10, doi="10.1/a"), _work(20, doi="10.1/b")]
    abstracts = [{"corpusid": 1, "abstract": "from s2", "openaccessinfo": {"license": "CCBY"}}]
    out = _link(papers, works, abstracts)
    assert (out[1]["abstract"], out[1]["abstract_source"], out[1]["abstract_license"]) == (
        "from s2",
        "s2",
        "CCBY",
    )
    assert (out[2]["abstract"], out[2]["abstract_source"], out[2]["abstract_license"]) == (
        "openalex abstract",
        "openalex",
        "CCBY",
    )


def test_newest_version_of_a_paper_and_of_a_work_wins():
    papers = [
        _paper(1, doi="10.1/a", title="old", updated="2025-01-01"),
        _paper(1, doi="10.1/a", title="new", updated="2026-01-01"),
    ]
    works = [
        _work(10, doi="10.1/a", field=11, updated="2025-01-01"),
        _work(10, doi="10.1/a", field=12, updated="2026-02-01"),
    ]
    out = _link(papers, works)
    assert len(out) == 1
    assert out[1]["title"] == "new" and out[1]["field_id"] == 12


def test_works_without_any_id_are_skipped_and_counted():
    keys = linking.work_keys(
        _parse(records.OPENALEX_WORKS, [_work(10), _work(11, doi="10.1/a")]), N
    )
    skipped = keys.filter(pc.equal(keys["_bucket"], SKIPPED))
    assert skipped["work_id"].to_pylist() == [10]


def test_citations_prefer_s2_contexts_then_s2orc_sentences():
    cits = _parse(
        records.S2_CITATIONS,
        [
            {
                "citingcorpusid": "1",
                "citedcorpusid": "2",
                "contexts": ["s2 says"],
                "intents": ["methodology"],
            },
            {"citingcorpusid": "1", "citedcorpusid": "3", "contexts": []},
            {"citingcorpusid": "1", "citedcorpusid": "4", "contexts": None},
        ],
    )
    recovered = pa.table(
        {
            "citing_id": pa.array([1, 1], pa.int64()),
            "cited_id": pa.array([2, 3], pa.int64()),
            "sentences": [["s2orc for 2"], ["s2orc for 3"]],
        }
    )
    out = {r["cited_id"]: r for r in linking.assemble_citations(cits, recovered).to_pylist()}
    assert (out[2]["contexts"], out[2]["context_source"], out[2]["intents"]) == (
        ["s2 says"],
        "s2",
        ["methodology"],
    )
    assert (out[3]["contexts"], out[3]["context_source"]) == (["s2orc for 3"], "s2orc")
    assert (out[4]["contexts"], out[4]["context_source"]) == ([], None)


def test_venues_link_by_any_issn_and_take_their_main_field():
    venues = _parse(
        records.S2_VENUES,
        [
            {
                "id": "v1",
                "name": "J One",
                "issn": "1234-5678",
                "alternate_issns": [],
                "type": "journal",
            },
            {
                "id": "v2",
                "name": "Conf",
                "issn": None,
                "alternate_issns": ["9999-000x"],
                "type": None,
            },
            {"id": "v3", "name": "Lonely", "issn": "0000-0001", "alternate_issns": []},
        ],
    )
    sources = _parse(
        records.OPENALEX_SOURCES,
        [
            {
                "id": "https://openalex.org/S5",
                "display_name": "J One",
                "type": "journal",
                "issn_l": "1234-5678",
                "issn": ["1234-5678"],
                "summary_stats": {"2yr_mean_citedness": 4.5, "h_index": 30},
            },
            {
                "id": "https://openalex.org/S6",
                "display_name": "Conf",
                "type": "conference",
                "issn_l": None,
                "issn": ["9999-000X"],
                "summary_stats": {"2yr_mean_citedness": 0.7},
            },
        ],
    )
    counts = pa.table(
        {
            "venue_id": ["v1", "v1", "v1", "v2"],
            "field_id": pa.array([17, 26, None, 31], pa.int32()),
            "n": pa.array([6, 2, 2, 5], pa.int64()),
        }
    )
    out = {r["venue_id"]: r for r in linking.assemble_venues(venues, sources, counts).to_pylist()}
    assert out["v1"]["openalex_source_id"] == 5 and out["v1"]["two_year_mean_citedness"] == 4.5
    assert (out["v1"]["field_id"], out["v1"]["field"], out["v1"]["n_papers"]) == (
        17,
        "Computer Science",
        10,
    )
    assert out["v1"]["field_share"] == 0.6
    assert (out["v2"]["openalex_source_id"], out["v2"]["type"], out["v2"]["domain"]) == (
        6,
        "conference",
        "Physical Sciences",
    )
    assert out["v3"]["openalex_source_id"] is None and out["v3"]["n_papers"] == 0


def test_duplicates_newest_first_then_a_stable_tie_break_whatever_the_order():
    rows = [
        _paper(1, doi="10.1/a", title="tie A", updated="2026-01-01"),
        _paper(1, doi="10.1/a", title="tie B", updated="2026-01-01"),
        _paper(1, doi="10.1/a", title="older", updated="2025-01-01"),
        _paper(2, doi="10.1/b", title="dated", updated="2020-01-01"),
        _paper(2, doi="10.1/b", title="undated", updated=None),  # loses to any timestamp
    ]
    winners = {
        tuple(r["title"] for r in _link(order, []).values())
        for order in (rows, rows[::-1], rows[1:] + rows[:1])
    }
    assert len(winners) == 1  # the same row, whatever order the shards came in
    [(first, second)] = winners
    assert first in ("tie A", "tie B") and second == "dated"
    parsed = _parse(records.S2_PAPERS, rows)
    assert linking.duplicates("papers", parsed) == 3


def test_duplicate_works_are_counted_once_per_work_not_per_key():
    works = [
        _work(10, doi="10.1/a", mag="5", updated="2025-01-01"),
        _work(10, doi="10.1/a", mag="5", updated="2026-01-01"),
        _work(11, doi="10.1/b"),
    ]
    keys = linking.work_keys(_parse(records.OPENALEX_WORKS, works), N)
    assert keys.filter(pc.greater_equal(keys["_bucket"], 0)).num_rows == 5  # doi+mag, doi+mag, doi
    assert linking.duplicates("works", keys.filter(pc.greater_equal(keys["_bucket"], 0))) == 1
