"""The synthetic corpus is deterministic, has the real record shapes, and joins as designed."""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from cpr_ray.corpus.taxonomy import DOMAINS, FIELDS
from cpr_ray.sample.synthetic import (
    OA_ONLY_WORK_BASE,
    WORK_ID_OFFSET,
    SyntheticStats,
    generate,
    main,
)

N_PAPERS, N_CITATIONS, SEED, SHARDS, MALFORMED_RATE = 4000, 30000, 11, 4, 0.02
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
WORK = re.compile(r"^https://openalex\.org/W(\d+)$")
ID_KEYS = {
    "papers": "corpusid",
    "abstracts": "corpusid",
    "citations": "citingcorpusid",
    "publication-venues": "id",
    "works": "id",
    "sources": "id",
}


def _expected_files(shards: int) -> set[str]:
    per_shard = {
        f"s2/{d}/{d}-{k:04d}.jsonl.gz"
        for d in ("papers", "abstracts", "citations")
        for k in range(shards)
    }
    works = {f"openalex/works/updated_date=2026-10-01/part_{k:04d}.gz" for k in range(shards)}
    return (
        per_shard
        | works
        | {
            "s2/publication-venues/publication-venues-0000.jsonl.gz",
            "openalex/sources/updated_date=2026-10-01/part_0000.gz",
        }
    )


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def _table_dir(root: Path, table: str) -> Path:
    return root / ("openalex" if table in ("works", "sources") else "s2") / table


def _lines(root: Path, table: str) -> list[tuple[str, str]]:
    """(file name, line) for every line of every shard of `table`."""
    return [
        (p.name, line)
        for p in sorted(_table_dir(root, table).rglob("*.gz"))
        for line in gzip.open(p, "rt", encoding="utf-8").read().splitlines()
    ]


def _valid_id(table: str, value: object) -> bool:
    if table == "publication-venues":
        return isinstance(value, str) and bool(UUID.match(value))
    if table in ("works", "sources"):
        return (
            isinstance(value, str)
            and re.match(r"^https://openalex\.org/[WS]\d+$", value) is not None
        )
    return isinstance(value, int) or (isinstance(value, str) and value.isdigit())


def _parse(table: str, line: str) -> dict | None:
    """The record, or None for a malformed line (not JSON, not an object, id missing or bad)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(record, dict) or not _valid_id(table, record.get(ID_KEYS[table])):
        return None
    return record


def _records(root: Path, table: str) -> list[dict]:
    return [r for _, line in _lines(root, table) if (r := _parse(table, line)) is not None]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SyntheticStats]:
    root = tmp_path_factory.mktemp("corpus")
    stats = generate(
        root,
        N_PAPERS,
        N_CITATIONS,
        seed=SEED,
        n_shards=SHARDS,
        malformed_rate=MALFORMED_RATE,
        overlap=0.9,
    )
    return root, stats


@pytest.fixture(scope="module")
def tables(corpus: tuple[Path, SyntheticStats]) -> dict[str, list[dict]]:
    return {table: _records(corpus[0], table) for table in ID_KEYS}


@pytest.fixture(scope="module")
def joined(tables: dict[str, list[dict]]) -> dict[int, tuple[dict, dict, str]]:
    """corpusid -> (paper, work, how) joined the way the ingest does: DOI, else MAG, else PubMed."""
    by_doi, by_mag, by_pmid = {}, {}, {}
    for work in tables["works"]:
        if work["doi"]:
            by_doi[work["doi"].removeprefix("https://doi.org/")] = work
        if work["ids"]["mag"]:
            by_mag[work["ids"]["mag"]] = work
        if work["ids"]["pmid"]:
            by_pmid[work["ids"]["pmid"].rsplit("/", 1)[1]] = work
    out = {}
    for paper in tables["papers"]:
        ext = paper["externalids"]
        for how, key, index in (
            ("doi", (ext["DOI"] or "").lower(), by_doi),
            ("mag", ext["MAG"], by_mag),
            ("pmid", ext["PubMed"], by_pmid),
        ):
            if key and key in index:
                out[paper["corpusid"]] = (paper, index[key], how)
                break
    return out


def _work_number(work: dict) -> int:
    return int(WORK.match(work["id"]).group(1))


def test_layout_is_exactly_the_snapshot_layout(corpus):
    root, _ = corpus
    assert _files(root) == _expected_files(SHARDS)


def test_same_seed_same_bytes_other_seed_other_bytes(corpus, tmp_path):
    root, _ = corpus
    again, other = tmp_path / "again", tmp_path / "other"
    generate(
        again, N_PAPERS, N_CITATIONS, seed=SEED, n_shards=SHARDS, malformed_rate=MALFORMED_RATE
    )
    generate(
        other, N_PAPERS, N_CITATIONS, seed=SEED + 1, n_shards=SHARDS, malformed_rate=MALFORMED_RATE
    )
    for name in _expected_files(SHARDS):
        assert (again / name).read_bytes() == (root / name).read_bytes(), name
    assert all(
        (other / name).read_bytes() != (root / name).read_bytes()
        for name in _expected_files(SHARDS)
    )


def test_record_counts_and_malformed_share(corpus, tables):
    root, stats = corpus
    counts = {
        "papers": stats.papers,
        "abstracts": stats.abstracts,
        "citations": stats.citations,
        "publication-venues": stats.venues,
        "works": stats.works,
        "sources": stats.sources,
    }
    assert stats.papers == N_PAPERS and stats.citations == N_CITATIONS
    assert stats.venues == 30 and stats.sources > stats.venues
    assert 0.75 < stats.abstracts / N_PAPERS < 0.85
    for table, expected in counts.items():
        lines = _lines(root, table)
        assert len(tables[table]) == expected, table
        assert len(lines) - expected == stats.malformed.get(table, 0), table
    for table in ("papers", "abstracts", "citations", "works"):
        share = stats.malformed[table] / (counts[table] + stats.malformed[table])
        assert MALFORMED_RATE * 0.6 < share < MALFORMED_RATE * 1.4, (table, share)
    assert "sources" not in stats.malformed


def test_malformed_lines_mix_all_kinds(corpus):
    root, _ = corpus
    kinds = Counter()
    for _, line in _lines(root, "citations"):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            kinds["garbage" if line.startswith("<html>") else "truncated"] += 1
            continue
        if "citingcorpusid" not in record:
            kinds["missing id"] += 1
        elif not _valid_id("citations", record["citingcorpusid"]):
            kinds["bad id"] += 1
    assert set(kinds) == {"garbage", "truncated", "missing id", "bad id"}, kinds


def test_s2_records_have_the_real_keys(tables):
    paper = tables["papers"][0]
    assert {
        "corpusid",
        "externalids",
        "title",
        "venue",
        "publicationvenueid",
        "year",
        "publicationdate",
        "citationcount",
        "isopenaccess",
        "s2fieldsofstudy",
        "updated",
    } <= paper.keys()
    assert set(paper["externalids"]) == {
        "ACL",
        "DBLP",
        "ArXiv",
        "MAG",
        "CorpusId",
        "PubMed",
        "DOI",
        "PubMedCentral",
    }
    for p in tables["papers"]:
        assert p["externalids"]["CorpusId"] == str(p["corpusid"])
        assert 1990 <= p["year"] <= 2025
        assert p["publicationdate"] is None or p["publicationdate"].startswith(f"{p['year']}-")
        assert p["publicationvenueid"] is None or UUID.match(p["publicationvenueid"])
    abstract = tables["abstracts"][0]
    assert {"corpusid", "abstract", "openaccessinfo", "updated"} <= abstract.keys()
    assert {"externalids", "license", "url", "status"} == set(abstract["openaccessinfo"])
    licenses = {a["openaccessinfo"]["license"] for a in tables["abstracts"]}
    assert {"CCBY", "CC0", None} <= licenses
    venue = tables["publication-venues"][0]
    assert {
        "id",
        "name",
        "issn",
        "alternate_issns",
        "alternate_names",
        "alternate_urls",
        "type",
        "url",
    } == set(venue)
    assert {v["type"] for v in tables["publication-venues"]} <= {"journal", "conference", None}


def test_papers_join_works_as_designed(tables, joined):
    papers, works = tables["papers"], tables["works"]
    for paper, work, _ in joined.values():
        assert _work_number(work) == WORK_ID_OFFSET + paper["corpusid"]
        assert work["title"] == paper["title"] and work["publication_year"] == paper["year"]
    assert len({_work_number(w) for _, w, _ in joined.values()}) == len(joined)
    assert len(joined) == round(0.9 * N_PAPERS)
    how = Counter(h for _, _, h in joined.values())
    assert abs(how["doi"] / len(joined) - 0.85) < 0.04
    assert abs(how["mag"] / len(joined) - 0.10) < 0.03
    assert abs(how["pmid"] / len(joined) - 0.05) < 0.02
    s2_dois = [p["externalids"]["DOI"] for p in papers if p["externalids"]["DOI"]]
    assert 0.15 < sum(d != d.lower() for d in s2_dois) / len(s2_dois) < 0.35
    assert all(w["doi"] is None or w["doi"] == w["doi"].lower() for w in works)
    oa_only = [w for w in works if _work_number(w) >= OA_ONLY_WORK_BASE]
    assert len(oa_only) + len(joined) == len(works)
    assert 0.04 < len(oa_only) / len(works) < 0.06


def test_venues_map_to_sources_by_issn(tables, joined):
    by_issn = {}
    for source in tables["sources"]:
        for issn in {source["issn_l"], *(source["issn"] or [])} - {None}:
            by_issn.setdefault(issn, set()).add(source["id"])
    venue_source = {}
    for venue in tables["publication-venues"]:
        hits = set().union(
            *(by_issn.get(i, set()) for i in [venue["issn"], *venue["alternate_issns"]])
        )
        assert len(hits) == 1, venue
        venue_source[venue["id"]] = hits.pop()
    checked = 0
    for paper, work, _ in joined.values():
        source = work["primary_location"]["source"]
        if paper["publicationvenueid"] and source and source["type"] != "repository":
            assert venue_source[paper["publicationvenueid"]] == source["id"]
            checked += 1
    assert checked > 0.5 * len(joined)
    citedness = {
        t: sorted(
            s["summary_stats"]["2yr_mean_citedness"] for s in tables["sources"] if s["type"] == t
        )
        for t in ("journal", "conference", "repository")
    }
    assert all(citedness.values())
    median = {t: v[len(v) // 2] for t, v in citedness.items()}
    assert median["conference"] < median["journal"]


def test_topics_follow_the_taxonomy(tables):
    same_field = cross_field = 0
    for work in tables["works"]:
        topics = work["topics"]
        assert 1 <= len(topics) <= 3 and work["primary_topic"] == topics[0]
        assert len({t["id"] for t in topics}) == len(topics)
        assert [t["score"] for t in topics] == sorted((t["score"] for t in topics), reverse=True)
        for topic in topics:
            assert re.match(r"^https://openalex\.org/T\d+$", topic["id"])
            field_id = int(topic["field"]["id"].rsplit("/", 1)[1])
            domain_id = int(topic["domain"]["id"].rsplit("/", 1)[1])
            subfield_id = int(topic["subfield"]["id"].rsplit("/", 1)[1])
            assert topic["field"]["display_name"] == FIELDS[field_id][0]
            assert domain_id == FIELDS[field_id][1]
            assert topic["domain"]["display_name"] == DOMAINS[domain_id]
            assert subfield_id // 100 == field_id and subfield_id % 100 < 10
        for topic in topics[1:]:
            if topic["field"]["id"] == topics[0]["field"]["id"]:
                same_field += 1
            else:
                cross_field += 1
    assert 0.75 < same_field / (same_field + cross_field) < 0.95


def test_openalex_records_have_the_real_shapes(tables):
    for work in tables["works"]:
        assert work["ids"]["openalex"] == work["id"]
        assert work["ids"]["mag"] is None or work["id"].endswith("W" + work["ids"]["mag"])
        assert work["ids"]["pmid"] is None or re.match(
            r"^https://pubmed\.ncbi\.nlm\.nih\.gov/\d+$", work["ids"]["pmid"]
        )
        assert work["doi"] is None or work["doi"].startswith("https://doi.org/10.")
        assert work["publication_date"].startswith(str(work["publication_year"]))
        assert work["referenced_works"] == [] and work["cited_by_count"] >= 0
        source = work["primary_location"]["source"]
        assert source is None or re.match(r"^https://openalex\.org/S\d+$", source["id"])
    for source in tables["sources"]:
        assert source["type"] in ("journal", "conference", "repository")
        stats = source["summary_stats"]
        assert stats["2yr_mean_citedness"] > 0 and 0 <= stats["h_index"] <= stats["i10_index"]


def test_inverted_indexes_spell_the_s2_abstract(tables, joined):
    abstracts = {a["corpusid"]: a["abstract"] for a in tables["abstracts"]}
    work_paper = {w["id"]: p for p, w, _ in joined.values()}
    indexed = [w for w in tables["works"] if w["abstract_inverted_index"] is not None]
    assert 0.01 < len(indexed) / len(tables["works"]) < 0.06
    compared = 0
    for work in indexed:
        words = {
            pos: word
            for word, positions in work["abstract_inverted_index"].items()
            for pos in positions
        }
        text = " ".join(words[i] for i in range(len(words)))
        paper = work_paper.get(work["id"])
        if paper and paper["corpusid"] in abstracts:
            assert text == abstracts[paper["corpusid"]]
            compared += 1
    assert compared > 0


def test_citations_shapes_and_graph(corpus, tables, joined):
    root, _ = corpus
    by_shard: dict[str, set[type]] = {}
    for name, line in _lines(root, "citations"):
        record = _parse("citations", line)
        if record is not None:
            by_shard.setdefault(name, set()).add(type(record["citingcorpusid"]))
    assert by_shard == {
        f"citations-{k:04d}.jsonl.gz": {str if k % 2 == 0 else int} for k in range(SHARDS)
    }
    citations = tables["citations"]
    year = {p["corpusid"]: p["year"] for p in tables["papers"]}
    field = {c: w["primary_topic"]["field"]["id"] for c, (_, w, _) in joined.items()}
    resolved = [
        (int(c["citingcorpusid"]), int(c["citedcorpusid"]))
        for c in citations
        if c["citedcorpusid"] is not None
    ]
    assert 0.07 < 1 - len(resolved) / len(citations) < 0.13
    assert len(set(resolved)) == len(resolved) and all(a != b for a, b in resolved)
    assert all(a in year and b in year for a, b in resolved)
    assert sum(year[b] <= year[a] for a, b in resolved) / len(resolved) > 0.95
    both = [(a, b) for a, b in resolved if a in field and b in field]
    cross = sum(field[a] != field[b] for a, b in both) / len(both)
    assert 0.12 < cross < 0.30, cross
    with_contexts = [c for c in citations if c["contexts"]]
    assert 0.55 < len(with_contexts) / len(citations) < 0.65
    assert all(1 <= len(c["contexts"]) <= 3 for c in with_contexts)
    assert {i for c in citations for i in c["intents"] or []} == {
        "background",
        "methodology",
        "result",
    }
    counts = Counter(b for _, b in resolved)
    assert all(p["citationcount"] == counts[p["corpusid"]] for p in tables["papers"])


def test_cli_writes_the_layout(tmp_path, capsys):
    main([str(tmp_path), "--papers", "300", "--citations", "900", "--seed", "3", "--shards", "2"])
    printed = json.loads(capsys.readouterr().out)
    assert printed["papers"] == 300 and printed["citations"] == 900
    assert _files(tmp_path) == _expected_files(2)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n_papers": 0},
        {"n_shards": 0},
        {"malformed_rate": 1.0},
        {"overlap": 1.5},
        {"n_citations": -1},
    ],
)
def test_rejects_bad_arguments(tmp_path, kwargs):
    args = {"n_papers": 10, "n_citations": 10, **kwargs}
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        generate(tmp_path, args.pop("n_papers"), args.pop("n_citations"), **args)
