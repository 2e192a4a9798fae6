"""The model's evaluation ledger (``evaluations.json`` beside its card) and the one publisher of
an evaluation: evaluations racing to record on one model, locally and on the loopback S3, keep
every entry and every row; a write that landed unseen is not recorded twice; a card of the
previous version (rows in Markdown only) becomes the ledger once and renders as it was; the
publisher writes the results, the card's row and prints where, and a card it cannot update is a
warning, the results still out.

``tests/data/legacy_model_card.md`` is a card as the previous version wrote it (its renderer and
its `add_evaluation`, five evaluations: a repeat, a variant with a reranker, a pipe in a protocol,
AnaloBench T1 with accuracy and Recall@5), with a hand edit below the table."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from cpr_ray.cards import evaluations as ledger
from cpr_ray.cards.model_card import render_card, with_evaluations
from cpr_ray.config import load_config
from cpr_ray.errors import StorageError
from cpr_ray.evaluate.publish import publish
from cpr_ray.storage import store as storage_module
from cpr_ray.storage.store import Storage, StorageConfig, join
from tests.cards.test_model_card import STORAGE, _facts, _results, model_index, record, rows

LEGACY = (Path(__file__).parents[1] / "data" / "legacy_model_card.md").read_text()


def entries(storage: Storage, model: str) -> list[dict]:
    return json.loads(storage.read_text(join(model, ledger.LEDGER)))["evaluations"]


def test_a_card_on_s3_gets_the_evaluation(s3_endpoint: str, s3_bucket: str):
    storage = Storage(StorageConfig(s3_endpoint=s3_endpoint))
    model = f"s3://{s3_bucket}/runs/r1/model"
    storage.write_text(f"{model}/README.md", render_card(_facts(model_uri=model)))
    assert record(storage, model, _results("cpr", 0.5)) == f"{model}/README.md"
    card = storage.read_text(f"{model}/README.md")
    assert len(rows(card)) == 1 and model_index(card)[0]["dataset"]["type"] == "cpr"
    assert [e["benchmark"] for e in entries(storage, model)] == ["cpr"]
    assert 'SentenceTransformer("PATH/TO/A/LOCAL/COPY")' in card
    assert record(storage, f"s3://{s3_bucket}/none", _results("cpr", 0.5)) is None


@pytest.fixture(params=["local", "s3"])
def folder(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Storage, str]:
    """A storage and a model folder, on each backend."""
    if request.param == "local":
        return STORAGE, str(tmp_path / "model")
    endpoint, bucket = (request.getfixturevalue(f) for f in ("s3_endpoint", "s3_bucket"))
    return Storage(StorageConfig(s3_endpoint=endpoint)), f"s3://{bucket}/r1/model"


@pytest.mark.parametrize("written_by", ["this version", "the previous version"])
def test_eight_evaluations_of_one_model_at_once_leave_eight_rows(folder, written_by):
    """A job array of 8 benchmarks: each run records on the card at the same moment (on a card
    of the previous version, each also finds no ledger and reads the card's rows first)."""
    storage, model = folder
    legacy = written_by == "the previous version"
    card = LEGACY if legacy else render_card(_facts(model_uri=model))
    storage.write_text(join(model, "README.md"), card)
    before = len(ledger.migrate(card))
    start, written = threading.Barrier(8), []

    def evaluate(i: int) -> None:
        results = _results("beir", 0.1 + i / 100, data=f"/data/set{i}")  # subset set{i}
        start.wait()
        written.append(record(storage, model, results))

    threads = [threading.Thread(target=evaluate, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert written == [join(model, "README.md")] * 8
    kept = entries(storage, model)
    assert len(kept) == before + 8 and len({e["id"] for e in kept}) == before + 8
    assert sorted(e["subset"] for e in kept[before:]) == [f"set{i}" for i in range(8)]
    card = storage.read_text(join(model, "README.md"))
    assert sorted(r.split(" | ")[2] for r in rows(card)[before:]) == [f"set{i}" for i in range(8)]
    assert rows(card)[:before] == rows(LEGACY if legacy else card)[:before]
    configs = [r["dataset"].get("config") for r in model_index(card)]
    assert sorted(c for c in configs if c and c.startswith("set")) == [f"set{i}" for i in range(8)]
    assert card == with_evaluations(card, ledger.read(storage, model, card))  # card = ledger


class LostReplies(Storage):
    """S3 when a conditional write lands but its reply is lost: the client's retry of the same
    request is refused, so the writer sees a conflict for a write of its own."""

    def __init__(self, storage: Storage, lose: int) -> None:
        super().__init__(storage.cfg)
        self.lose = lose

    def write_if(self, uri: str, data: bytes, *, tag: str | None = None) -> str | None:
        landed = super().write_if(uri, data, tag=tag)
        if self.lose:
            self.lose -= 1
            return None
        return landed


def test_a_write_that_landed_unseen_is_not_recorded_twice(folder):
    storage, model = folder
    storage.write_text(join(model, "README.md"), render_card(_facts(model_uri=model)))
    assert record(LostReplies(storage, 2), model, _results("cpr", 0.5))  # ledger, then card
    assert len(entries(storage, model)) == 1
    card = storage.read_text(join(model, "README.md"))
    assert len(rows(card)) == 1 and len(model_index(card)) == 1


class Overtaken(Storage):
    """Another writer that changes the file just before each of our conditional writes."""

    def __init__(self, storage: Storage) -> None:
        super().__init__(storage.cfg)

    def write_if(self, uri: str, data: bytes, *, tag: str | None = None) -> str | None:
        self.write_text(uri, self.read_text(uri) + "\n")  # a new version, still what it was
        return super().write_if(uri, data, tag=tag)


def test_a_writer_that_keeps_losing_gives_up_naming_the_file(tmp_path, monkeypatch):
    storage, model = STORAGE, str(tmp_path / "model")  # the loop is the same on either backend
    uri = join(model, "README.md")
    storage.write_text(uri, render_card(_facts(model_uri=model)))
    with pytest.raises(StorageError, match=f"{uri}: changed by other writers 3 times"):
        Overtaken(storage).update_text(uri, lambda text: f"{text}ours\n", tries=3)
    assert not storage.read_text(uri).endswith("ours\n")
    # an evaluation that keeps losing the ledger says which file, and adds no row
    record(storage, model, _results("cpr", 0.5))
    monkeypatch.setattr(storage_module, "UPDATE_BACKOFF_S", 0.0)
    at = join(model, ledger.LEDGER)
    with pytest.raises(StorageError, match=f"{at}: changed by other writers"):
        record(Overtaken(storage), model, _results("beir", 0.5))
    assert len(entries(storage, model)) == 1 and len(rows(storage.read_text(uri))) == 1


def test_a_card_of_the_previous_version_becomes_the_ledger_once(tmp_path: Path):
    migrated = ledger.migrate(LEGACY)
    assert [(e.benchmark, e.subset, e.variant, e.protocol) for e in migrated] == [
        ("cpr", None, None, "dense"),
        ("beir", "scifact", None, "dense"),
        ("cpr", None, None, "dense"),
        ("cpr", None, "no-e5", "dense + rerank tournament"),
        ("analobench", "t1", None, "a|b"),
    ]
    assert migrated[3].n_queries == 1234 and migrated[3].seconds is None
    assert migrated[4].metrics["accuracy"] == (0.41, None, None)  # from its model-index entry
    assert migrated[4].metrics["ndcg_at_10"] == (0.2, 0.1, 0.3)  # the row's interval
    assert with_evaluations(LEGACY, migrated) == LEGACY  # rendered from it: the card it was
    broken = LEGACY.replace("| 1,234 |", "| many |")
    with pytest.raises(StorageError, match=r"evaluation row 4 is not as cpr-ray wrote it"):
        ledger.migrate(broken)
    # the first evaluation recorded on it writes the ledger: the card's five rows, then its own
    model = tmp_path / "model"
    model.mkdir()
    (model / "README.md").write_text(LEGACY)
    later = _results("cpr", 0.9, created="2025-07-01T08:00:00+00:00")
    assert record(STORAGE, str(model), later) == str(model / "README.md")
    kept = entries(STORAGE, str(model))
    assert [e["id"] for e in kept[:5]] == [f"card-row-{i}" for i in range(1, 6)]
    card = (model / "README.md").read_text()
    assert rows(card) == [*rows(LEGACY), rows(card)[-1]] and "| 2025-07-01 08:00 |" in card
    assert [r["task"]["name"] for r in model_index(card)][-1] == "Retrieval (dense)"
    assert model_index(card)[-1]["metrics"][0]["value"] == 0.9
    assert "A note of my own." in card  # the hand edit stays
    # read once: the next evaluation adds to the ledger, the card's rows are not read again
    record(STORAGE, str(model), _results("beir", 0.4))
    card = (model / "README.md").read_text()
    assert len(entries(STORAGE, str(model))) == 7 and len(rows(card)) == 7
    # a card rendered again (a rerun finishing the training) keeps them
    assert rows(render_card(_facts(), ledger.read(STORAGE, str(model), None))) == rows(card)


def _run(**over) -> dict:
    """A run's results as `cpr eval` writes them (BEIR: no MTEB file)."""
    block = {"value": 0.3, "ci_low": 0.2, "ci_high": 0.4, "random": 0.01, "vs_random": 30.0}
    return _results("beir", 0.3, ndcg_at_10=block, primary_metric="ndcg_at_10", **over)


def test_the_publisher_writes_the_results_and_the_row_and_says_where(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "README.md").write_text(render_card(_facts(model_uri=str(model))))
    out = tmp_path / "out"
    cfg = load_config(flags={"eval.out": str(out), "encoder.model": str(model)})
    published = publish(cfg, _run())
    (written,) = out.glob("*.json")
    assert json.loads(written.read_text())["ndcg_at_10"]["value"] == 0.3
    assert published.lines() == [
        "beir dense: ndcg_at_10 0.300 [0.200, 0.400] (random 0.010), 300 queries",
        f"results → {written}",
        f"model card → {model / 'README.md'}",
    ]
    assert entries(STORAGE, str(model))[0]["results"] == str(written)
    # a ledger that is not one: a warning naming it; the results are written all the same
    (model / ledger.LEDGER).write_text("{}")
    again = publish(cfg, _run(created="2025-06-05T10:00:00+00:00"))
    assert again.card_uri is None and again.results_uri == str(written)
    err = capsys.readouterr().err
    assert f"model card not updated: {model / ledger.LEDGER}: not a cpr-ray evaluation" in err
    assert len(rows((model / "README.md").read_text())) == 1
