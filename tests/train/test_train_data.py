"""Training-data readers, each on a tiny file in its public format, and their errors."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cpr_ray.config import QUESTION_WORDS, load_config
from cpr_ray.dataset.format import CORPUS, CPR_TRAIN
from cpr_ray.errors import ConfigError, InputError, UserError
from cpr_ray.queries.content_words import STOP_WORDS, content_word_counts
from cpr_ray.retrieval.model_source import model_config
from cpr_ray.retrieval.spec import EncoderSpec
from cpr_ray.storage.store import Storage, StorageConfig
from cpr_ray.tables.schemas import paper_text
from cpr_ray.train.data import read_examples
from cpr_ray.train.examples import DataOptions

STORAGE = Storage(StorageConfig())


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _read(fmt: str, data: str, **kw) -> tuple[pa.Table, dict]:
    return read_examples(STORAGE, DataOptions(format=fmt, data=data, **kw))


def _paper(cid: int, title: str, abstract: str | None, domain: str) -> dict:
    return {
        "corpus_id": cid,
        "title": title,
        "abstract": abstract,
        "abstract_license": "CC-BY",
        "year": 2020,
        "publication_date": None,
        "topics": [],
        "field": "f",
        "domain": domain,
    }


@pytest.fixture()
def cpr_export(tmp_path: Path) -> Path:
    out = tmp_path / "export"
    out.mkdir()
    papers = [
        _paper(1, "Ship hulls", "Drag of hulls.", "Physical Sciences"),
        _paper(2, "Shark skin", "Riblets cut drag.", "Life Sciences"),
        _paper(3, "Bird wings", None, "Life Sciences"),  # licence: no abstract
        _paper(4, "Why ants?", "Ant colonies.", "Life Sciences"),
        _paper(5, "Heart valves", "Flow in valves.", "Health Sciences"),
        _paper(6, "Turbines", "Blades.", "Physical Sciences"),
    ]
    pq.write_table(pa.Table.from_pylist(papers, schema=CORPUS), out / "corpus.parquet")
    rows = [
        (
            "q1",
            "How to reduce the drag of a hull?",
            1,
            2,
            [3, 4],
            "Engineering",
            "Physical Sciences",
        ),
        ("q2", "How to cool a turbine blade?", 1, 6, [3], "Engineering", "Physical Sciences"),
        ("q3", "How to model valve flow?", 5, 5, [2, 3], "Medicine", "Health Sciences"),
        ("q4", "How to grow colonies?", 4, 2, [3, 3], "Biology", "Life Sciences"),  # repeated
    ]
    cols = ["query_id", "query", "base_corpus_id", "positive_id", "negative_ids", "field", "domain"]
    table = pa.Table.from_pylist([dict(zip(cols, r)) for r in rows], schema=CPR_TRAIN)
    pq.write_table(table, out / "cpr-train.parquet")
    return out


def test_cpr_export_resolves_texts_through_the_corpus(cpr_export: Path):
    ex, stats = _read("cpr", str(cpr_export))
    assert ex.column("query_id").to_pylist() == ["q1", "q2", "q3"]
    first = ex.slice(0, 1).to_pylist()[0]
    assert first["positive"] == "Shark skin. Riblets cut drag."
    assert first["negatives"] == ["Bird wings", "Why ants? Ant colonies."]
    assert first["positive_key"] == 2 and first["negative_keys"] == [3, 4]
    assert first["cw"] == 4  # how, reduce, drag, hull
    assert stats["dropped_repeated_negatives"] == 1 and stats["examples"] == 3


def test_cpr_hold_out_domain_drops_its_queries_and_positives(cpr_export: Path):
    ex, stats = _read("cpr", str(cpr_export), hold_out_domain="Life Sciences")
    assert ex.column("query_id").to_pylist() == ["q2", "q3"]  # q1's positive is Life Sciences
    assert stats["dropped_held_out_domain"] == 1
    with pytest.raises(ConfigError, match="'Earth' is not a domain.*Health Sciences"):
        _read("cpr", str(cpr_export), hold_out_domain="Earth")


def test_cpr_id_missing_from_corpus_names_row_and_column(cpr_export: Path):
    table = pq.read_table(cpr_export / "cpr-train.parquet").to_pylist()
    table[2]["negative_ids"] = [2, 99]
    pq.write_table(pa.Table.from_pylist(table, schema=CPR_TRAIN), cpr_export / "cpr-train.parquet")
    with pytest.raises(
        InputError, match=r"cpr-train.parquet row 3: column 'negative_ids': paper 99"
    ):
        _read("cpr", str(cpr_export))


def test_triplets_jsonl_and_parquet(tmp_path: Path):
    rows = [
        {"query": "how do sharks swim", "positive": "Shark skin", "negatives": ["Turbines"]},
        {"query": "q two", "positive": "Heart valves", "negatives": []},
        {"query": "q three", "positive": "Ant colonies", "negatives": ["Ant colonies"]},
        {"query": "q four", "positive": "Bird wings", "negatives": ["x", "x"]},
        {"query": "q five", "positive": "Gears", "negatives": [" "]},
    ]
    ex, stats = _read("triplets", _jsonl(tmp_path / "t.jsonl", rows))
    assert ex.column("query").to_pylist() == ["how do sharks swim", "q two"]
    assert ex.column("query_id").to_pylist() == ["t.jsonl:1", "t.jsonl:2"]
    assert ex.column("negatives").to_pylist() == [["Turbines"], []]
    assert (stats["dropped_positive_among_negatives"], stats["dropped_repeated_negatives"]) == (
        1,
        1,
    )
    assert stats["dropped_empty_text"] == 1
    pq.write_table(pa.Table.from_pylist([{"query": "a", "positive": "b"}]), tmp_path / "t.parquet")
    ex, _ = _read("triplets", str(tmp_path / "t.parquet"))  # no negatives column: in-batch only
    assert ex.column("negatives").to_pylist() == [[]]


def test_triplets_whose_every_negatives_list_is_empty_train_in_batch(tmp_path: Path):
    """Arrow reads a column of only empty lists as list<null> (from JSON lines, and as Parquet
    stores it): a list of texts with no items, which trains in-batch only, as docs/training.md
    says."""
    rows = [
        {"query": f"how to do {i}", "positive": f"paper {i}", "negatives": []} for i in range(3)
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "empty.parquet")
    assert pq.read_schema(tmp_path / "empty.parquet").field("negatives").type == pa.list_(pa.null())
    for uri in (_jsonl(tmp_path / "empty.jsonl", rows), str(tmp_path / "empty.parquet")):
        ex, stats = _read("triplets", uri)
        assert ex.schema.field("negatives").type == pa.list_(pa.string())
        assert ex.column("negatives").to_pylist() == [[], [], []]
        assert ex.column("negative_keys").to_pylist() == [[], [], []]
        assert stats["examples"] == 3 and stats["max_negatives"] == 0


def test_triplets_sampling_and_switches(tmp_path: Path):
    rows = [
        {"query": f"query {i}", "positive": f"doc {i}", "negatives": [f"n{i}", f"m{i}"]}
        for i in range(20)
    ]
    uri = _jsonl(tmp_path / "t.jsonl", rows)
    a, _ = _read("triplets", uri, samples=5, seed=1)
    b, _ = _read("triplets", uri, samples=5, seed=1)
    c, _ = _read("triplets", uri, samples=5, seed=2)
    assert (
        a.column("query").to_pylist()
        == b.column("query").to_pylist()
        != c.column("query").to_pylist()
    )
    assert _read("triplets", uri, negatives=1)[0].column("negatives").to_pylist()[0] == ["n0"]
    assert _read("triplets", uri, in_batch_only=True)[1]["max_negatives"] == 0
    with pytest.raises(ConfigError, match="names no domains"):
        _read("triplets", uri, hold_out_domain="Life Sciences")


def _passages(selected: list[int], prefix: str) -> list[dict]:
    return [
        {"is_selected": s, "passage_text": f"{prefix} passage {i}", "url": f"u{i}"}
        for i, s in enumerate(selected)
    ]


def test_msmarco_both_public_layouts(tmp_path: Path):
    good = [0, 1] + [0] * 10  # one selected, eleven unselected
    records = [
        {"query": "what is a hull", "query_id": 7, "passages": _passages(good, "a")},
        {"query": "two selected", "query_id": 8, "passages": _passages([1, 1] + [0] * 9, "b")},
        {"query": "too few", "query_id": 9, "passages": _passages([1] + [0] * 8, "c")},
    ]
    original = _jsonl(tmp_path / "train_v1.1.jsonl", records)
    hf = [
        {
            **r,
            "passages": {
                k: [p[k] for p in r["passages"]] for k in ("is_selected", "passage_text", "url")
            },
        }
        for r in records
    ]
    pq.write_table(pa.Table.from_pylist(hf), tmp_path / "train-00000.parquet")
    for uri in (original, str(tmp_path / "train-00000.parquet")):
        ex, stats = _read("msmarco", uri)
        (row,) = ex.to_pylist()
        assert (row["query_id"], row["positive"]) == ("7", "a passage 1")
        assert row["negatives"] == ["a passage 0"] + [f"a passage {i}" for i in range(2, 10)]
        assert stats["dropped_msmarco_selection"] == 2


def test_reasonir_pairs_and_hq_ids(tmp_path: Path):
    instr = "Given a question, retrieve documents"
    rows = [
        {
            "query": [instr, "Why do ships roll?"],
            "pos": [[instr, "Rolling is…"]],
            "neg": [[instr, "Pitch"]],
        },
        {"query": [instr, "hq query"], "pos": [[instr, "biology/doc1.txt"]], "neg": [[instr, "n"]]},
    ]
    uri = _jsonl(tmp_path / "reasonir.jsonl", rows)
    ex, _ = _read("reasonir", uri)
    assert ex.column("query").to_pylist() == ["Why do ships roll?", "hq query"]
    assert ex.column("positive").to_pylist() == ["Rolling is…", "biology/doc1.txt"]
    assert ex.column("negatives").to_pylist() == [["Pitch"], ["n"]]
    docs = _jsonl(tmp_path / "documents.jsonl", [{"id": "biology/doc1.txt", "content": "Cells."}])
    ex, _ = _read("reasonir", uri, reasonir_documents=docs)
    assert ex.column("positive").to_pylist() == ["Rolling is…", "Cells."]


def test_specter_triplets_are_title_dot_abstract(tmp_path: Path):
    def p(t, a, i):
        return {"title": t, "abstract": a, "corpus_id": i}

    rows = [
        {
            "query": p("Hulls", "Drag.", 1),
            "pos": p("Skins", "Riblets.", 2),
            "neg": p("Gears", None, 3),
        }
    ]
    (row,) = _read("specter", _jsonl(tmp_path / "cite.jsonl", rows))[0].to_pylist()
    assert (row["query"], row["positive"], row["negatives"]) == (
        "Hulls. Drag.",
        "Skins. Riblets.",
        ["Gears"],
    )


@pytest.mark.parametrize(
    "lines, message",
    [
        (['{"query": "a", "negatives": []}'], r"t.jsonl: missing column 'positive'"),
        (
            ['{"query": "a", "positive": "b"}', '{"query": 3, "positive": "b"}'],
            r"t.jsonl line 2: column 'query' holds int",
        ),
        (
            ['{"query": "a", "positive": "b"}', "", '{"query": " ", "positive": "b"}'],
            r"t.jsonl line 3: column 'query' is empty",
        ),
        (
            ['{"query": "a", "positive": "b"}', '{"query": "a", "positive": null}'],
            r"t.jsonl line 2: column 'positive' is missing or null",
        ),
        (['{"query": "a", "positive": "b"}', "{oops"], r"t.jsonl line 2: not valid JSON"),
        (
            ['{"query": "a", "positive": "b", "negatives": "c"}'],
            r"t.jsonl line 1: column 'negatives' holds string",
        ),
    ],
)
def test_malformed_triplets_name_file_line_and_column(tmp_path: Path, lines, message):
    (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=message):
        _read("triplets", str(tmp_path / "t.jsonl"))


def test_malformed_parquet_and_missing_paths(tmp_path: Path):
    pq.write_table(pa.table({"query": ["a", "b"], "positive": ["x", None]}), tmp_path / "t.parquet")
    with pytest.raises(InputError, match=r"t.parquet row 2: column 'positive' is missing or null"):
        _read("triplets", str(tmp_path / "t.parquet"))
    with pytest.raises(InputError, match="does not exist"):
        _read("specter", str(tmp_path / "nowhere"))
    with pytest.raises(InputError, match="not a CPR export: no cpr-train or corpus"):
        _read("cpr", str(tmp_path))
    with pytest.raises(UserError, match=r"^encoder.model: /no/such/model \(read as a folder\)"):
        model_config(EncoderSpec(model="/no/such/model"))


def test_paper_text_and_content_words():
    assert paper_text(
        pa.array(["A", "B?", "", None]), pa.array(["x.", "y", "z", None])
    ).to_pylist() == [
        "A. x.",
        "B? y",
        "z",
        "",
    ]
    assert not set(STOP_WORDS) & set(QUESTION_WORDS)
    assert content_word_counts(
        ["How to reduce the drag of a ship hull?", "What is it"]
    ).tolist() == [5, 1]


def test_config_refuses_stop_words_with_question_words():
    with pytest.raises(ConfigError, match=r"train.cw_stop_words: holds question words \(how\)"):
        load_config(overrides=["train.cw_stop_words=[the, how]"])
    with pytest.raises(ConfigError, match="multiple of workers"):
        load_config(overrides=["train.batch_size=5", "train.workers=2"])
