"""Benchmark loaders: AnaloBench on the real files, CPR-eval / BEIR / BRIGHT on constructed ones."""

from __future__ import annotations

import collections
import csv
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cpr_ray.dataset.format import CPR_EVAL
from cpr_ray.errors import ConfigError, InputError
from cpr_ray.evaluate.loaders import load_benchmark
from cpr_ray.evaluate.loaders.analobench import load_analobench
from cpr_ray.evaluate.loaders.beir import load_beir
from cpr_ray.evaluate.loaders.bright import load_bright
from cpr_ray.evaluate.loaders.cpr_eval import GROUPS, load_cpr
from cpr_ray.retrieval.base import PAD
from cpr_ray.storage.store import Storage, StorageConfig, StorageError
from tests.builds import upload_tree

DOMAINS = ["Life Sciences", "Physical Sciences", "Social Sciences", "Health Sciences"]
WORDS = (
    "graph diffusion lattice enzyme market tumor sediment orbit neuron protein soil climate "
    "vaccine network turbulence crystal voter fiscal glacier battery catalyst genome galaxy "
    "plasma aquifer migration contract"
).split()


def local() -> Storage:
    return Storage(StorageConfig(root="/tmp"))


def make_cpr_export(
    root: Path, n_queries: int = 12, per_group: int = 4, seed: int = 0, bad: bool = False
) -> dict:
    """A small export in the DESIGN.md format: each query's positive shares a rare word with it.

    Pools: the positive, then `per_group` negatives in each of the three negative groups.
    With `bad`, three more records break the contract in three ways.
    """
    rng = np.random.default_rng(seed)
    corpus, rows = [], []
    next_id = 1000

    def paper(title, abstract, field, domain):
        nonlocal next_id
        next_id += 1
        corpus.append(
            {
                "corpus_id": next_id,
                "title": title,
                "abstract": abstract,
                "abstract_license": "CC-BY" if abstract else None,
                "year": 2020,
                "field": field,
                "domain": domain,
            }
        )
        return next_id

    for q in range(n_queries):
        domain = DOMAINS[q % len(DOMAINS)]
        key = f"keyword{q}"
        pos = paper(f"A {key} method", f"We study {key} with {rng.choice(WORDS)}.", "F", domain)
        cands, groups = [pos], ["positive"]
        for g in GROUPS[1:]:
            for _ in range(per_group):
                words = " ".join(rng.choice(WORDS, 5))
                cands.append(
                    paper(words.title(), None if rng.random() < 0.3 else words, "F", domain)
                )
                groups.append(g)
        order = rng.permutation(len(cands) - 1) + 1  # the positive stays first (pool order)
        cands = [cands[0]] + [cands[i] for i in order]
        groups = [groups[0]] + [groups[i] for i in order]
        rows.append(
            {
                "query_id": f"q{q}",
                "query": f"how to handle {key} in {rng.choice(WORDS)} systems",
                "base_corpus_id": 1,
                "positive_id": pos,
                "candidate_ids": cands,
                "candidate_groups": groups,
                "field": "F",
                "domain": domain,
            }
        )
    if bad:
        good = rows[0]
        rows.append(
            {**good, "query_id": "bad-len", "candidate_groups": good["candidate_groups"][:-1]}
        )
        rows.append({**good, "query_id": "bad-pos", "positive_id": 1})
        rows.append(
            {**good, "query_id": "bad-doc", "candidate_ids": [*good["candidate_ids"][:-1], 7]}
        )
    root.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(corpus), root / "corpus.parquet")
    (root / "cpr-eval").mkdir(exist_ok=True)
    pq.write_table(
        pa.Table.from_pylist(rows, schema=CPR_EVAL), root / "cpr-eval" / "part-0.parquet"
    )
    train = [{"query": r["query"], "positive_id": r["positive_id"]} for r in rows[:3]]
    pq.write_table(pa.Table.from_pylist(train), root / "cpr-train.parquet")
    return {"rows": rows, "corpus": corpus}


def test_cpr_loader_on_constructed_export(tmp_path):
    made = make_cpr_export(tmp_path / "export", bad=True)
    bench = load_cpr(local(), str(tmp_path / "export"))
    assert bench.n_queries == 12 and bench.pools.shape == (12, 13)
    assert sorted(r["reason"] for r in bench.rejects) == [
        "candidate missing from the corpus",
        "candidate_ids and candidate_groups differ in length",
        "positive_id is not among candidate_ids",
    ]
    for i, row in enumerate(made["rows"][:12]):
        ids = [bench.doc_ids[p] for p in bench.pools[i]]
        assert ids == [str(c) for c in row["candidate_ids"]]  # pool order kept
        assert list(bench.pool_groups[i]) == row["candidate_groups"]
        assert bench.qrels[i] == {bench.doc_ids.index(str(row["positive_id"])): 1}
        assert bench.domains[i] == row["domain"]
    by_id = {str(c["corpus_id"]): c for c in made["corpus"]}
    for doc_id, text in zip(bench.doc_ids, bench.doc_texts):
        c = by_id[doc_id]
        assert text == (f"{c['title']}. {c['abstract']}" if c["abstract"] else c["title"])
    assert len(bench.train_pairs) == 3 and "keyword0" in bench.train_pairs[0][1]


def test_a_repeated_candidate_is_ranked_once(tmp_path):
    """A negative listed twice in a pool is ranked once, where it was first listed (MTEB keys a
    pool by id), and counted; a query whose lists differ in length before others leaves their
    candidate groups aligned."""
    made = make_cpr_export(tmp_path / "export", n_queries=3)
    rows = made["rows"]
    twice = rows[0]["candidate_ids"][1:3]
    repeated = {
        **rows[0],
        "candidate_ids": [*rows[0]["candidate_ids"], *twice],
        "candidate_groups": [*rows[0]["candidate_groups"], *rows[0]["candidate_groups"][1:3]],
    }
    misaligned = {**rows[2], "query_id": "short", "candidate_groups": ["positive"]}
    part = tmp_path / "export" / "cpr-eval" / "part-0.parquet"
    schema = pq.read_schema(part)
    pq.write_table(pa.Table.from_pylist([misaligned, repeated, *rows[1:]], schema=schema), part)
    bench = load_cpr(local(), str(tmp_path / "export"))
    assert bench.query_ids == ["q0", "q1", "q2"]
    for i, row in enumerate(rows):
        ids = [bench.doc_ids[p] for p in bench.pools[i] if p != PAD]
        assert ids == [str(c) for c in row["candidate_ids"]]
        assert list(bench.pool_groups[i][: len(ids)]) == row["candidate_groups"]
    assert sorted(r["reason"] for r in bench.rejects) == [
        "2 repeated candidate(s) in the candidate_ids of 1 queries dropped (each candidate is "
        "ranked once)",
        "candidate_ids and candidate_groups differ in length",
    ]


def test_an_id_listed_twice_is_refused_in_every_format(tmp_path):
    made = make_cpr_export(tmp_path / "export", n_queries=2)
    pq.write_table(
        pa.Table.from_pylist([*made["corpus"], made["corpus"][0]]),
        tmp_path / "export" / "corpus.parquet",
    )
    with pytest.raises(InputError, match=r"corpus.parquet: 1 id\(s\) listed more than once"):
        load_cpr(local(), str(tmp_path / "export"))
    _write_beir(tmp_path / "beir")
    corpus = tmp_path / "beir" / "corpus.jsonl"
    corpus.write_text(corpus.read_text() + '{"_id": "d3", "title": "", "text": "again"}\n')
    with pytest.raises(InputError, match="corpus.jsonl: 1 id.*the first: 'd3'"):
        load_beir(local(), str(tmp_path / "beir"))
    _write_beir(tmp_path / "beir2")
    queries = tmp_path / "beir2" / "queries.jsonl"
    queries.write_text(queries.read_text() + '\n{"_id": "q1", "text": "solar again"}\n')
    with pytest.raises(InputError, match="queries.jsonl: 1 id"):
        load_beir(local(), str(tmp_path / "beir2"))


def test_cpr_loader_names_what_is_missing(tmp_path):
    with pytest.raises(StorageError, match="no cpr-eval or corpus table"):
        load_cpr(local(), str(tmp_path))


def test_cpr_loader_reads_from_s3(tmp_path, s3_endpoint, s3_bucket):
    make_cpr_export(tmp_path / "export", n_queries=4)
    upload_tree(s3_endpoint, s3_bucket, tmp_path / "export", "exports/v1")
    storage = Storage(StorageConfig(root=f"s3://{s3_bucket}", s3_endpoint=s3_endpoint))
    (bench,) = load_benchmark("cpr", storage, f"s3://{s3_bucket}/exports/v1")
    assert bench.n_queries == 4 and (bench.pools != PAD).sum() == 4 * 13


def test_cpr_full_ranks_the_whole_corpus_without_the_base_paper(tmp_path):
    made = make_cpr_export(tmp_path / "export", n_queries=5)
    rows = made["rows"]
    base = made["corpus"][3]["corpus_id"]  # one query's base paper is in the corpus
    rows[0]["base_corpus_id"] = base
    table = pq.read_table(tmp_path / "export" / "cpr-eval" / "part-0.parquet").to_pylist()
    table[0]["base_corpus_id"] = base
    schema = pq.read_schema(tmp_path / "export" / "cpr-eval" / "part-0.parquet")
    pq.write_table(
        pa.Table.from_pylist(table, schema=schema),
        tmp_path / "export" / "cpr-eval" / "part-0.parquet",
    )
    (full,) = load_benchmark("cpr-full", local(), str(tmp_path / "export"))
    assert full.name == "cpr-full" and full.pools is None and full.pool_groups is None
    assert full.doc_ids == sorted(str(c["corpus_id"]) for c in made["corpus"])  # every paper
    for i, row in enumerate(rows):
        assert full.qrels[i] == {full.doc_ids.index(str(row["positive_id"])): 1}
    assert [list(e) for e in full.excluded] == [[full.doc_ids.index(str(base))], [], [], [], []]
    assert list(full.pool_sizes()) == [len(full.doc_ids) - 1] + [len(full.doc_ids)] * 4


def test_analobench_t2_on_the_real_files(analobench):
    bench = load_analobench(local(), str(analobench), subset="t2")
    assert bench.n_queries == 340 and bench.pools.shape == (340, 200)
    assert (bench.pools != PAD).all()
    with open(analobench / "AnaloBench-T2-Base.csv") as f:
        rows = list(csv.DictReader(f))
    for i, row in enumerate(rows):
        options = [int(x) for x in row["Options"].split(",")]
        answers = [options[int(a) - 1] for a in row["Indices"].split(",")]  # 1-based positions
        assert bench.pools[i].tolist() == options
        assert bench.qrels[i] == {a: 1 for a in answers}
        assert i not in options  # a sentence never ranks itself
    counts = collections.Counter(len(q) for q in bench.qrels)
    assert counts == {5: 222, 7: 16, 9: 10, 11: 60, 13: 14, 17: 18}
    # the analogous answers are exactly the other members of the query's cluster
    cluster = np.array(bench.meta["cluster"])
    for i in range(0, 340, 17):
        assert set(bench.qrels[i]) == set(np.flatnonzero(cluster == cluster[i])) - {i}
    assert len(set(cluster.tolist())) == 47


@pytest.mark.parametrize("stories", ["stories-10", "stories-30"])
def test_analobench_story_variants(analobench, stories):
    base = load_analobench(local(), str(analobench), subset="t2")
    bench = load_analobench(local(), str(analobench), subset=f"t2-{stories}")
    assert bench.qrels == base.qrels and (bench.pools == base.pools).all()
    assert bench.queries == bench.doc_texts
    lengths = [len(t) for t in bench.doc_texts]
    assert min(lengths) > max(len(t) for t in base.doc_texts)  # stories, not sentences


def test_analobench_t1_items_are_deterministic_and_well_formed(analobench):
    a = load_analobench(local(), str(analobench), subset="t1", seed=0)
    b = load_analobench(local(), str(analobench), subset="t1", seed=0)
    c = load_analobench(local(), str(analobench), subset="t1", seed=1)
    assert (a.pools == b.pools).all() and a.qrels == b.qrels
    assert not (a.pools == c.pools).all()
    cluster = np.array(a.meta["cluster"])
    assert a.pools.shape == (340, 4) and a.primary_metric == "accuracy"
    for q in range(340):
        (answer,) = a.qrels[q]
        options = a.pools[q].tolist()
        assert answer in options and q not in options
        assert cluster[answer] == cluster[q]
        others = [cluster[o] for o in options if o != answer]
        assert len(set(others)) == 3 and cluster[q] not in others
    # the right option is not always in the same place
    positions = collections.Counter(
        a.pools[q].tolist().index(next(iter(a.qrels[q]))) for q in range(340)
    )
    assert len(positions) == 4 and min(positions.values()) > 50


def test_analobench_unknown_subset(tmp_path):
    with pytest.raises(ConfigError, match="unknown AnaloBench subset"):
        load_analobench(local(), str(tmp_path), subset="t3")


def _write_beir(root: Path) -> None:
    (root / "qrels").mkdir(parents=True)
    corpus = [
        {
            "_id": "d1",
            "title": "Solar cells",
            "text": "Perovskite light absorbers.",
            "metadata": {},
        },
        {"_id": 2, "title": "", "text": "Wind turbine wakes.", "metadata": {"x": [1]}},
        {"_id": "d3", "title": "Bees", "text": "Pollination networks."},
    ]
    (root / "corpus.jsonl").write_text("\n".join(json.dumps(c) for c in corpus) + "\n")
    queries = [
        {"_id": "q1", "text": "solar energy"},
        {"_id": "q2", "text": "wind"},
        {"_id": "q3", "text": "unjudged"},
    ]
    (root / "queries.jsonl").write_text("\n".join(json.dumps(q) for q in queries))
    (root / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\nq1\td1\t2\nq1\td3\t0\nq2\t2\t1\nq2\tmissing\t1\nq9\td1\t1\n"
    )
    (root / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq3\td3\t1\n")


def test_beir_loader_on_constructed_set(tmp_path):
    _write_beir(tmp_path / "beir")
    bench = load_beir(local(), str(tmp_path / "beir"))
    assert bench.pools is None
    assert bench.doc_ids == ["d1", "2", "d3"]  # numeric ids read as text
    assert bench.doc_texts == [  # title + " " + text, as MTEB gives a model a BEIR document
        "Solar cells Perovskite light absorbers.",
        "Wind turbine wakes.",
        "Bees Pollination networks.",
    ]
    assert bench.query_ids == ["q1", "q2"]  # only queries with qrels in the split
    assert bench.qrels == [{0: 2, 2: 0}, {1: 1}]
    reasons = [r["reason"] for r in bench.rejects]
    assert "qrels name a query missing from queries.jsonl" in reasons
    assert "1 qrels name unknown documents" in reasons
    assert bench.train_pairs == [("unjudged", "Bees Pollination networks.")]
    assert bench.pool_sizes().tolist() == [3, 3]


def test_beir_loader_errors(tmp_path):
    with pytest.raises(StorageError, match="not a BEIR folder"):
        load_beir(local(), str(tmp_path))
    _write_beir(tmp_path / "b")
    (tmp_path / "b" / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1 d1\n")
    with pytest.raises(InputError, match="line 2"):
        load_beir(local(), str(tmp_path / "b"))
    (tmp_path / "b" / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n")
    with pytest.raises(InputError, match="no qrels lines"):
        load_beir(local(), str(tmp_path / "b"))


def test_bright_loader_on_constructed_subsets(tmp_path):
    root = tmp_path / "bright"
    for sub, n in (("biology", 5), ("economics", 3)):
        (root / "documents").mkdir(parents=True, exist_ok=True)
        (root / "examples").mkdir(parents=True, exist_ok=True)
        docs = pa.table(
            {
                "id": [f"{sub}/{i}.txt" for i in range(n)],
                "content": [f"{sub} document {i}" for i in range(n)],
            }
        )
        pq.write_table(docs, root / "documents" / f"{sub}-00000-of-00001.parquet")
        ex = pa.table(
            {
                "query": [f"{sub} question"],
                "reasoning": ["r"],
                "id": ["0"],
                "excluded_ids": [[f"{sub}/1.txt", "N/A"]],
                "gold_ids_long": [["x"]],
                "gold_ids": [[f"{sub}/0.txt", f"{sub}/2.txt", "gone.txt"]],
            }
        )
        pq.write_table(ex, root / "examples" / f"{sub}-00000-of-00001.parquet")
    bench = load_bright(local(), str(root), subset="biology")
    assert bench.name == "bright:biology" and len(bench.doc_ids) == 5
    assert bench.qrels == [{0: 1, 2: 1}]
    assert bench.excluded[0].tolist() == [1]
    assert bench.pool_sizes().tolist() == [4]
    assert bench.rejects == [{"query_id": "*", "reason": "1 gold ids not in documents"}]
    parts = load_benchmark("bright", local(), str(root), subset="biology,economics")
    assert [p.name for p in parts] == ["bright:biology", "bright:economics"]
    with pytest.raises(StorageError, match="no documents file for BRIGHT subset 'robotics'"):
        load_bright(local(), str(root), subset="robotics")


def test_beir_never_returns_the_query_itself(tmp_path):
    root = tmp_path / "beir"
    _write_beir(root)
    with open(root / "corpus.jsonl", "a") as f:
        f.write("\n" + json.dumps({"_id": "q2", "title": "wind", "text": "wind"}) + "\n")
    bench = load_beir(local(), str(root))
    assert [e.tolist() for e in bench.excluded] == [[], [3]]
    assert bench.pool_sizes().tolist() == [4, 3]


def test_cpr_eval_columns_are_typed_before_any_row_is_judged(tmp_path):
    """The loaders share the training data's typed column checker: a missing or mistyped column
    is one line naming the file and the column, not a crash in the pool arithmetic."""
    make_cpr_export(tmp_path / "export", n_queries=4)
    path = tmp_path / "export" / "cpr-eval" / "part-0.parquet"
    table = pq.read_table(path)
    at = table.schema.get_field_index("candidate_ids")
    as_text = pa.array(
        [[str(c) for c in ids] for ids in table["candidate_ids"].to_pylist()], pa.list_(pa.string())
    )
    pq.write_table(table.set_column(at, "candidate_ids", as_text), path)
    wrong = r"cpr-eval row 1: column 'candidate_ids' holds list<element: string>, expected a list"
    with pytest.raises(InputError, match=wrong):
        load_cpr(local(), str(tmp_path / "export"))
    pq.write_table(table.drop_columns(["positive_id"]), path)
    with pytest.raises(InputError, match=r"cpr-eval: missing column 'positive_id'"):
        load_cpr(local(), str(tmp_path / "export"))
