"""Citing sentences recovered from a real S2ORC record's bibref/bibentry spans."""

import gzip
import json

import pyarrow as pa

from cpr_ray.corpus.s2orc import citing_sentences, recover_contexts
from tests.builds import S2_SAMPLES


def _record(corpus_id):
    with gzip.open(S2_SAMPLES / "s2orc/s2orc-sample.jsonl.gz", "rt") as f:
        return next(r for r in map(json.loads, f) if r["corpusid"] == corpus_id)


def test_sentence_around_a_real_citation():
    rec = _record(255785057)
    ann = rec["content"]["annotations"]
    found = citing_sentences(rec["content"]["text"], ann["bibref"], ann["bibentry"])
    assert found == [
        (
            18141559,
            "It was brought to our attention that there was a discrepancy between the description "
            "and implementation of the MINE algorithm in our article [1].",
        )
    ]


def test_every_recovered_sentence_contains_its_citation_span():
    rec = _record(255784639)
    text, ann = rec["content"]["text"], rec["content"]["annotations"]
    found = citing_sentences(text, ann["bibref"], ann["bibentry"])
    assert len(found) >= 10
    entries = {
        e["attributes"]["id"]: e["attributes"].get("matched_paper_id")
        for e in json.loads(ann["bibentry"])
    }
    for ref in json.loads(ann["bibref"]):
        cited = entries.get((ref.get("attributes") or {}).get("ref_id"))
        if cited is None:
            continue
        marker = " ".join(text[ref["start"] : ref["end"]].split())
        assert any(c == cited and marker in s for c, s in found), (cited, marker)


def test_broken_annotations_give_no_sentences_not_a_crash():
    assert (
        citing_sentences(
            "Some text [1].", "not json", '[{"attributes": {"id": "b0", "matched_paper_id": 5}}]'
        )
        == []
    )
    assert (
        citing_sentences(
            "Some text [1].", '[{"attributes": {"ref_id": "b0"}, "start": 10, "end": 13}]', None
        )
        == []
    )
    out = citing_sentences(
        "First claim. Second claim [1]. Third.",
        '[{"attributes": {"ref_id": "b0"}, "start": 26, "end": 29}]',
        '[{"attributes": {"id": "b0", "matched_paper_id": "77"}}]',
    )
    assert out == [(77, "Second claim [1].")]


def test_recover_contexts_groups_per_cited_paper():
    rec = _record(255783198)
    ann = rec["content"]["annotations"]
    docs = pa.table(
        {
            "corpus_id": [rec["corpusid"]],
            "text": [rec["content"]["text"]],
            "bibref": [ann["bibref"]],
            "bibentry": [ann["bibentry"]],
        }
    )
    out = recover_contexts(docs)
    pairs = list(zip(out["citing_id"].to_pylist(), out["cited_id"].to_pylist()))
    assert len(pairs) == len(set(pairs)) > 10
    assert all(c == rec["corpusid"] for c, _ in pairs)
