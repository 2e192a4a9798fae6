"""Every real Semantic Scholar and OpenAlex sample record parses; bad lines are quarantined."""

import gzip
import json

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from cpr_ray.corpus import records
from cpr_ray.corpus.linking import work_keys
from cpr_ray.tables.buckets import REJECTED, SKIPPED
from tests.builds import OPENALEX_SAMPLE, S2_SAMPLES


def _lines(path) -> pa.Table:
    text = gzip.open(path, "rt").read().split("\n")
    return pa.table({"text": text, "path": [str(path)] * len(text)})


def _lines_of(*rows: str) -> pa.Table:
    return pa.table({"text": list(rows), "path": ["mem"] * len(rows)})


SAMPLES = [
    ("papers", S2_SAMPLES / "papers/papers-sample.jsonl.gz", 100),
    ("abstracts", S2_SAMPLES / "abstracts/abstracts-sample.jsonl.gz", 100),
    ("citations", S2_SAMPLES / "citations/citations-sample.jsonl.gz", 100),
    (
        "publication-venues",
        S2_SAMPLES / "publication-venues/publication-venues-sample.jsonl.gz",
        100,
    ),
    ("s2orc", S2_SAMPLES / "s2orc/s2orc-sample.jsonl.gz", 8),
    ("works", OPENALEX_SAMPLE, 3684),
]


@pytest.mark.parametrize(("name", "path", "n"), SAMPLES)
def test_real_samples_parse_without_rejects(name, path, n):
    out = records.parse_lines(_lines(path), records.SPECS[name], num_buckets=4)
    assert out.num_rows == n
    assert out["reject_reason"].null_count == n, pc.unique(out["reject_reason"]).to_pylist()
    assert pc.min(out["_bucket"]).as_py() >= SKIPPED


def test_s2_papers_ids_are_normalised():
    out = records.parse_lines(
        _lines(S2_SAMPLES / "papers/papers-sample.jsonl.gz"), records.S2_PAPERS, 4
    )
    row = out.filter(pc.equal(out["corpus_id"], 223588394)).to_pylist()[0]
    # the sample writes this DOI in upper case and MAG as a string
    assert row["doi"] == "10.3760/cma.j.issn.2095-1485.2006.01.019"
    assert row["mag_id"] == 3032046382
    assert row["year"] == 2006 and str(row["publication_date"]) == "2006-02-28"
    assert out.schema.field("corpus_id").type == pa.int64()
    assert set(pc.unique(out["_bucket"]).to_pylist()) <= {0, 1, 2, 3}
    assert row["_bucket"] == 223588394 % 4


def test_s2_citations_string_ids_and_unresolved():
    out = records.parse_lines(
        _lines(S2_SAMPLES / "citations/citations-sample.jsonl.gz"),
        records.S2_CITATIONS,
        4,
    )
    assert out.schema.field("citing_id").type == pa.int64()
    unresolved = out.filter(pc.equal(out["_bucket"], SKIPPED))
    assert unresolved.num_rows == 17  # citedcorpusid null in the sample
    assert unresolved["cited_id"].null_count == 17
    with_ctx = out.filter(pc.greater(pc.list_value_length(out["contexts"]), 0))
    assert with_ctx.num_rows > 0
    assert all(isinstance(s, str) for c in with_ctx["contexts"].to_pylist() for s in c)


def test_openalex_topics_hierarchy_ids_become_integers():
    out = records.parse_lines(_lines(OPENALEX_SAMPLE), records.OPENALEX_WORKS, 4)
    first = out.filter(pc.equal(out["work_id"], 110308591)).to_pylist()[0]
    assert first["topics"][0] == {
        "id": 10399,
        "name": "Hydrocarbon exploration and reservoir analysis",
        "score": pytest.approx(0.9903, abs=1e-4),
        "subfield_id": 2211,
        "subfield": "Mechanics of Materials",
        "field_id": 22,
        "field": "Engineering",
        "domain_id": 3,
        "domain": "Physical Sciences",
    }
    lengths = pc.list_value_length(out["topics"]).to_pylist()
    assert max(lengths) <= 3
    assert sum(1 for n in lengths if n) == 3594  # works with topics, per the sample's README


def test_openalex_abstract_rebuilt_from_inverted_index():
    works = [json.loads(line) for line in gzip.open(OPENALEX_SAMPLE, "rt")]
    work = next(w for w in works if w["abstract_inverted_index"] and w["doi"])
    index = work["abstract_inverted_index"]
    expected = " ".join(word for _, word in sorted((p, w) for w, ps in index.items() for p in ps))
    parsed = records.parse_lines(_lines_of(json.dumps(work)), records.OPENALEX_WORKS, 4)
    keys = work_keys(parsed, 4)
    assert keys.filter(pc.equal(keys["key_type"], "doi"))["abstract"].to_pylist() == [expected]


BAD_PAPERS = [
    ('{"corpusid": 12, "title": "trunc', "malformed_json"),
    ("not json at all", "malformed_json"),
    ("[1, 2, 3]", "not_a_json_object"),
    ('{"title": "no id"}', "missing_corpusid"),
    ('{"corpusid": "abc"}', "bad_corpusid"),
    ('{"corpusid": null}', "missing_corpusid"),
    ('{"corpusid": -5}', "bad_corpusid"),
]


def test_malformed_papers_are_quarantined_with_reason_and_raw_line():
    good = '{"corpusid": "42", "externalids": {"DOI": "https://doi.org/10.1/X"}, "year": "2020"}'
    out = records.parse_lines(
        _lines_of(good, "", *[b for b, _ in BAD_PAPERS]), records.S2_PAPERS, 4
    )
    assert out.num_rows == 1 + len(BAD_PAPERS)  # the blank line is no record
    rejected = out.filter(pc.equal(out["_bucket"], REJECTED))
    assert (
        list(zip(rejected["raw"].to_pylist(), rejected["reject_reason"].to_pylist())) == BAD_PAPERS
    )
    assert set(rejected["path"].to_pylist()) == {"mem"}
    kept = out.filter(pc.greater_equal(out["_bucket"], 0)).to_pylist()
    assert [(r["corpus_id"], r["doi"], r["year"]) for r in kept] == [(42, "10.1/x", 2020)]


def test_raw_line_is_truncated_to_limit():
    line = '{"corpusid": "x' + "y" * 500
    out = records.parse_lines(_lines_of(line), records.S2_PAPERS, 4, raw_limit=100)
    assert len(out["raw"][0].as_py()) == 100


def test_bad_cited_id_is_rejected_not_skipped():
    out = records.parse_lines(
        _lines_of(
            '{"citingcorpusid": "1", "citedcorpusid": "2x"}',
            '{"citingcorpusid": "1", "citedcorpusid": null}',
            '{"citingcorpusid": null, "citedcorpusid": "3"}',
        ),
        records.S2_CITATIONS,
        2,
    )
    assert out["reject_reason"].to_pylist() == ["bad_citedcorpusid", None, "missing_citingcorpusid"]
    assert out["_bucket"].to_pylist() == [REJECTED, SKIPPED, REJECTED]


STRICT_IDS = [
    ('{"corpusid": 42}', 42, None),
    ('{"corpusid": "42"}', 42, None),
    ('{"corpusid": 1579548549.6}', None, "bad_corpusid"),  # never rounded to 1579548550
    ('{"corpusid": 7.0}', None, "bad_corpusid"),  # integral, but a float: pinned as a reject
    ('{"corpusid": "7.0"}', None, "bad_corpusid"),
    ('{"corpusid": "1e3"}', None, "bad_corpusid"),
    ('{"corpusid": "0x1F"}', None, "bad_corpusid"),
    ('{"corpusid": "+12"}', None, "bad_corpusid"),
    ('{"corpusid": 99999999999999999999}', None, "bad_corpusid"),  # beyond int64
    ('{"corpusid": 1, "externalids": {"MAG": 3.5}}', None, "bad_mag_id"),
    ('{"corpusid": 1, "externalids": {"PubMed": "PMC31415"}}', None, "bad_pmid"),
    ('{"corpusid": 1, "updated": "yesterday"}', None, "bad_updated"),
]


@pytest.mark.parametrize(("line", "corpus_id", "reason"), STRICT_IDS)
def test_ids_are_integers_as_written_or_a_reject(line, corpus_id, reason):
    [row] = records.parse_lines(_lines_of(line), records.S2_PAPERS, 4).to_pylist()
    assert row["reject_reason"] == reason
    if reason is None:
        assert row["corpus_id"] == corpus_id


@pytest.mark.parametrize(
    ("work_id", "expected"),
    [
        ('"https://openalex.org/W6"', 6),
        ('"https://openalex.org/w6"', 6),
        ("6.0", None),
        ('"6.0"', None),  # was work 0: the digits after the dot
        ('"https://openalex.org/W6.0"', None),
        ('"https://openalex.org/A6"', None),  # an author id is not a work id
        ("6", None),
    ],
)
def test_openalex_work_ids_must_be_work_urls(work_id, expected):
    [row] = records.parse_lines(
        _lines_of(f'{{"id": {work_id}}}'), records.OPENALEX_WORKS, 4
    ).to_pylist()
    assert (row["work_id"], row["reject_reason"]) == (
        (expected, None) if expected else (None, "bad_id")
    )


def test_list_fields_of_the_wrong_type_are_rejects():
    cites = records.parse_lines(
        _lines_of(
            '{"citingcorpusid": 1, "citedcorpusid": 2, "contexts": "one sentence"}',
            '{"citingcorpusid": 1, "citedcorpusid": 2, "contexts": ["a", 1]}',
            '{"citingcorpusid": 1, "citedcorpusid": 2, "intents": "methodology"}',
            '{"citingcorpusid": 1, "citedcorpusid": 2, "contexts": null, "intents": []}',
        ),
        records.S2_CITATIONS,
        4,
    )
    assert cites["reject_reason"].to_pylist() == [
        "bad_contexts",
        "bad_contexts",
        "bad_intents",
        None,
    ]
    assert cites["contexts"].to_pylist()[3] is None and cites["intents"].to_pylist()[3] == []
    works = records.parse_lines(
        _lines_of(
            '{"id": "https://openalex.org/W1", "topics": ["Physics", "Maths"]}',
            '{"id": "https://openalex.org/W2", "topics": "Physics"}',
            '{"id": "https://openalex.org/W3", "topics": [{"id": "https://openalex.org/T6.0"}]}',
            '{"id": "https://openalex.org/W4", "topics": null}',
            '{"id": "https://openalex.org/W5", "topics": []}',
        ),
        records.OPENALEX_WORKS,
        4,
    )
    assert works["reject_reason"].to_pylist() == ["bad_topics"] * 3 + [None, None]
    assert works["topics"].to_pylist()[3:] == [None, []]  # no topics, said two ways


def test_reasons_given_by_the_shard_reader_are_kept():
    lines = pa.table(
        {
            "text": ['{"corpusid": 1}', "caf\ufffd", "gzip data ends early at byte 9"],
            "path": ["a.gz"] * 3,
            "reject": [None, "not_utf8", "corrupt_shard"],
        }
    )
    out = records.parse_lines(lines, records.S2_PAPERS, 4)
    assert out["reject_reason"].to_pylist() == [None, "not_utf8", "corrupt_shard"]
    assert out["raw"].to_pylist()[1:] == ["caf\ufffd", "gzip data ends early at byte 9"]
