"""Ingest under bad input, as a user meets it: through `cpr build`, or in the stage's outputs.

Each test breaks one promise the docs make: a gzip shard cut in half (fail, or quarantine),
ids that are not integers, list fields of the wrong type, an empty shard or input, duplicate
records, a build root in a bucket that does not exist, an input path that does not exist. The
checks that need no Ray run `cpr` as a subprocess and show that Ray never started.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
from typer.testing import CliRunner

from cpr_ray.config import load_config
from cpr_ray.corpus.ingest import ingest
from cpr_ray.corpus.shards import BrokenShard, ReadShards, inflate, split_lines
from cpr_ray.cpr_command import app
from cpr_ray.errors import InputError
from cpr_ray.runs.ray_runtime import user_errors_from_ray
from cpr_ray.storage.store import Storage, StorageConfig
from tests.standins.launch import CPR


def _shard(path: Path, rows: list[Any]) -> Path:
    """A gzipped JSONL shard; a row that is a string is written as it is."""
    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(text.encode()))
    return path


def _paper(cid: Any, title: str | None = None, updated: str = "2026-01-01T00:00:00Z") -> dict:
    return {
        "corpusid": cid,
        "title": title or f"paper {cid}",
        "year": 2019,
        "externalids": {"DOI": f"10.1/{cid}"},
        "updated": updated,
    }


def _citation(citing: Any, cited: Any, contexts: Any = None) -> dict:
    return {"citingcorpusid": citing, "citedcorpusid": cited, "contexts": contexts}


def _work(wid: Any, doi: str, field: int = 17, topics: Any = None, updated: str = "") -> dict:
    topic = {
        "id": "https://openalex.org/T11",
        "display_name": "t",
        "score": 0.9,
        "subfield": {"id": f"https://openalex.org/subfields/{field}01", "display_name": "s"},
        "field": {"id": f"https://openalex.org/fields/{field}", "display_name": "f"},
        "domain": {"id": "https://openalex.org/domains/3", "display_name": "d"},
    }
    return {
        "id": wid,
        "doi": f"https://doi.org/{doi}",
        "topics": [topic] if topics is None else topics,
        "updated_date": updated or "2026-01-01T00:00:00",
    }


def _corpus(raw: Path, papers: int = 20) -> None:
    """Papers 1..`papers` with DOIs, a work for each, citations i → i+1: a corpus with nothing
    wrong, for a test to add its one bad shard to."""
    _shard(raw / "s2/papers/papers-0000.jsonl.gz", [_paper(i) for i in range(1, papers + 1)])
    _shard(
        raw / "s2/citations/citations-0000.jsonl.gz",
        [_citation(i, i + 1, ["a sentence"]) for i in range(1, papers)],
    )
    _shard(
        raw / "openalex/works/updated_date=2026-01-01/part_0000.gz",
        [_work(f"https://openalex.org/W{i}", f"10.1/{i}") for i in range(1, papers + 1)],
    )


def _overrides(root: Path, raw: Path, **extra: str) -> list[str]:
    settings = {
        "storage.root": str(root),
        "input.s2": str(raw / "s2"),
        "input.openalex": str(raw / "openalex"),
        "ingest.num_buckets": "2",
        **extra,
    }
    return [f"{k}={v}" for k, v in settings.items()]


def _cpr_build(root: Path, raw: Path, **extra: str) -> tuple[int, str]:
    """`cpr build --stages ingest` in this process (on the test session's Ray)."""
    args = ["build", "--profile", "dry-run", "--stages", "ingest"]
    for item in _overrides(root, raw, **extra):
        args += ["--set", item]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "1000"})
    return result.exit_code, result.output


def _error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error:")]


def _rejects(manifest: dict) -> list[tuple[str, str, str]]:
    rows = pq.read_table(manifest["tables"]["rejects"]["uri"]).to_pylist()
    return sorted((r["dataset"], r["reason"], r["raw"]) for r in rows)


def _lance_rows(manifest: dict, table: str) -> list[dict]:
    return lance.dataset(manifest["tables"][table]["uri"]).to_table().to_pylist()


# -- a shard cut in half ---------------------------------------------------------------------


def _lines(pieces: list[bytes]) -> list[str]:
    return [t for table in split_lines(pieces, "mem") for t in table["text"].to_pylist()]


def test_shard_reader_names_the_byte_and_line_where_a_gzip_breaks():
    data = gzip.compress(b"".join(b'{"n": %d}\r\n' % i for i in range(3000)))
    whole = data + gzip.compress(b"last\n")  # a second gzip member, as `cat a.gz b.gz` makes
    assert _lines(inflate([whole[:1000], whole[1000:]]))[-2:] == ['{"n": 2999}', "last"]
    read: list[str] = []
    with pytest.raises(BrokenShard) as cut:
        for table in split_lines(inflate([data[:3000]]), "mem"):
            read += table["text"].to_pylist()
    assert 0 < len(read) < 3000 and read[-1] == f'{{"n": {len(read) - 1}}}'  # whole lines only
    assert cut.value.detail == (
        f"gzip data ends early at byte 3,000 (the file is truncated), after line {len(read):,}"
    )
    damaged = bytearray(data)
    damaged[len(data) // 2] ^= 0xFF
    with pytest.raises(BrokenShard, match="gzip data is damaged within compressed bytes"):
        _lines(inflate([bytes(damaged)]))
    assert _lines(inflate([gzip.compress(b"")])) == [] and _lines(inflate([])) == []


def test_shard_reader_sets_bad_utf8_lines_aside_and_skips_quarantined_shards(tmp_path):
    [table] = split_lines([b'{"a": 1}\n\xff\xfe\n{"b": 2}\n'], "mem")
    assert table["reject"].to_pylist() == [None, "not_utf8", None]
    shard = _shard(tmp_path / "s.jsonl.gz", [{"corpusid": 1}])
    reader = ReadShards(Storage(StorageConfig(root=str(tmp_path))), "fail", {str(shard): "cut"})
    [marker] = reader(pa.table({"path": [str(shard)]}))
    assert marker.to_pylist() == [{"text": "cut", "path": str(shard), "reject": "corrupt_shard"}]


def _cut_shard(raw: Path) -> tuple[Path, int]:
    """A papers shard of ids 1001.. cut in half: thousands of good lines before the break."""
    path = _shard(raw / "s2/papers/papers-0001.jsonl.gz", [_paper(i) for i in range(1001, 6001)])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path, len(data) // 2


@pytest.mark.usefixtures("ray_session")
def test_corrupt_shard_fails_in_one_line_naming_it_and_where(tmp_path):
    raw, root = tmp_path / "raw", tmp_path / "build"
    _corpus(raw)
    bad, size = _cut_shard(raw)

    code, output = _cpr_build(root, raw)

    assert code == 2, output
    assert "Traceback" not in output
    [line] = _error_lines(output)
    assert f"shard {bad} is corrupt: gzip data ends early at byte {size:,}" in line
    assert "(the file is truncated), after line " in line
    assert "ingest.on_corrupt_shard=quarantine" in line
    log = Path(line.rsplit("Ray traceback in ", 1)[1].rstrip(")"))
    assert log.parent == root / "_logs"
    assert "Traceback" in log.read_text() and "InputError" in log.read_text()
    assert not (root / "ingest" / "_MANIFEST.json").exists()  # nothing published


@pytest.mark.usefixtures("ray_session")
def test_corrupt_shard_quarantined_by_config_keeps_every_intact_shard(tmp_path):
    raw, root = tmp_path / "raw", tmp_path / "build"
    _corpus(raw)
    bad, _ = _cut_shard(raw)

    code, output = _cpr_build(root, raw, **{"ingest.on_corrupt_shard": "quarantine"})

    assert code == 0, output
    manifest = json.loads((root / "ingest" / "_MANIFEST.json").read_text())
    stats = manifest["stats"]
    [quarantined] = stats["quarantined_shards"]
    assert quarantined["input"] == "papers" and quarantined["shard"] == str(bad)
    assert "truncated" in quarantined["detail"]
    assert stats["inputs"]["papers"]["quarantined_shards"] == 1
    # every line of the intact shard, none of the quarantined one (not even those before the cut)
    ids = sorted(r["corpus_id"] for r in _lance_rows(manifest, "papers"))
    assert ids == list(range(1, 21))
    assert [(d, r) for d, r, _ in _rejects(manifest)] == [("papers", "corrupt_shard")]


# -- ids, list fields, empty shards and duplicates: one small corpus, ingested once -------------


@pytest.fixture(scope="module")
def dirty(tmp_path_factory: pytest.TempPathFactory, ray_session: None) -> dict:
    """The manifest of an ingest of a corpus that has one of each problem below."""
    tmp = tmp_path_factory.mktemp("dirty")
    raw = tmp / "raw"
    _corpus(raw)
    _shard(
        raw / "s2/papers/papers-0001.jsonl.gz",
        [
            _paper(1579548549.6),  # a fraction: must not become 1579548550
            _paper(7.0),  # integral, but a float: rejected too, never guessed at
            _paper("0x1F"),
            _paper("12", title="string id", updated="2026-03-01T00:00:00Z"),  # the id 12
            _paper(1, title="newer", updated="2026-06-01T00:00:00Z"),  # newest version wins
            _paper(2),  # the same record twice: one is kept, one counted as a duplicate
        ],
    )
    (raw / "s2/papers/papers-0002.jsonl.gz").write_bytes(b"")  # a zero-byte shard
    _shard(
        raw / "s2/citations/citations-0001.jsonl.gz",
        [
            _citation(129159511.5, 2),
            _citation(3, 4, contexts="a string, not a list"),
            _citation(1, 2, ["a sentence"]),  # a duplicate of 1 → 2
        ],
    )
    _shard(
        raw / "openalex/works/updated_date=2026-02-01/part_0000.gz",
        [
            _work(6.0, "10.1/6"),
            _work("6.0", "10.1/6"),
            _work(  # newer than the good W13, but its topics are strings: a reject, not a win
                "https://openalex.org/W13",
                "10.1/13",
                topics=["a topic", "another"],
                updated="2026-02-01T00:00:00",
            ),
            _work("https://openalex.org/W5", "10.1/5", field=26, updated="2026-02-01T00:00:00"),
        ],
    )
    cfg = load_config("dry-run", env={}, overrides=_overrides(tmp / "build", raw))
    return ingest(cfg, Storage(cfg.storage))


def test_non_integral_or_malformed_ids_are_rejects_never_other_ids(dirty):
    rejects = _rejects(dirty)
    assert [r[:2] for r in rejects if "1579548549.6" in r[2]] == [("papers", "bad_corpusid")]
    assert [r[:2] for r in rejects if '"corpusid": 7.0' in r[2]] == [("papers", "bad_corpusid")]
    assert [r[:2] for r in rejects if "0x1F" in r[2]] == [("papers", "bad_corpusid")]
    assert [r[:2] for r in rejects if "129159511.5" in r[2]] == [
        ("citations", "bad_citingcorpusid")
    ]
    assert [r[:2] for r in rejects if '"id": 6.0' in r[2] or '"id": "6.0"' in r[2]] == [
        ("works", "bad_id"),
        ("works", "bad_id"),
    ]
    papers = {r["corpus_id"]: r for r in _lance_rows(dirty, "papers")}
    assert set(papers) == {*range(1, 21)}  # "12" is 12, already there; nothing rounded in
    # works 6.0 and "6.0" share W6's DOI: read as work 0, they would have won the link
    assert papers[6]["openalex_id"] == 6
    assert {r["openalex_id"] for r in papers.values()} - {None} <= set(range(1, 21))
    citing = {r["citing_id"] for r in _lance_rows(dirty, "citations")}
    assert citing <= set(range(1, 21))


def test_list_fields_of_the_wrong_type_are_rejects_with_their_reason(dirty):
    rejects = _rejects(dirty)
    assert [r[:2] for r in rejects if "a string, not a list" in r[2]] == [
        ("citations", "bad_contexts")
    ]
    assert [r[:2] for r in rejects if '"a topic"' in r[2]] == [("works", "bad_topics")]
    citations = {(r["citing_id"], r["cited_id"]): r for r in _lance_rows(dirty, "citations")}
    assert citations[(3, 4)]["contexts"] == ["a sentence"]  # the good copy, not []
    papers = {r["corpus_id"]: r for r in _lance_rows(dirty, "papers")}
    assert papers[13]["openalex_id"] == 13 and papers[13]["topics"][0]["id"] == 11


def test_zero_byte_shard_is_skipped_and_counted(dirty):
    papers = dirty["stats"]["inputs"]["papers"]
    assert (papers["shards"], papers["empty_shards"]) == (3, 1)


def test_duplicates_keep_the_newest_and_are_counted_in_the_summary(dirty):
    stats = dirty["stats"]["inputs"]
    # papers 1 (older and newer), 2 and 12 (twice each); citation 1 → 2; work 5 (two snapshots)
    assert stats["papers"]["duplicates"] == 3
    assert stats["citations"]["duplicates"] == 1
    assert stats["works"]["duplicates"] == 1
    assert dirty["stats"]["duplicates"] == 5
    assert dirty["stats"]["papers"] == 20  # kept minus duplicates dropped
    papers = {r["corpus_id"]: r for r in _lance_rows(dirty, "papers")}
    assert papers[1]["title"] == "newer"
    assert papers[12]["title"] == "string id"  # newer `updated` than the first paper 12
    assert papers[5]["field_id"] == 26  # the work's newer snapshot partition


@pytest.mark.usefixtures("ray_session")
def test_required_input_with_no_lines_is_named(tmp_path):
    raw, root = tmp_path / "raw", tmp_path / "build"
    _corpus(raw)
    _shard(raw / "s2/papers/papers-0000.jsonl.gz", [])  # a valid gzip of zero lines

    code, output = _cpr_build(root, raw)

    assert code == 2, output
    [line] = _error_lines(output)
    assert f"required input 'papers' is empty: its 1 shard(s) under {raw / 's2/papers'}" in line
    assert "hold no lines" in line


# -- checked before Ray starts -----------------------------------------------------------------


def _cpr_subprocess(tmp_path: Path, *overrides: str) -> tuple[int, str, float, Path]:
    """`cpr build --stages ingest` as a user runs it; Ray's files would go to the returned dir."""
    ray_dir = tmp_path / "ray"
    args = [*CPR, "build", "--profile", "dry-run"]
    args += ["--stages", "ingest", "--set", f"ray.temp_dir={ray_dir}"]
    for item in overrides:
        args += ["--set", item]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"COLUMNS": "1000"}
    started = time.monotonic()
    out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    return out.returncode, out.stdout + out.stderr, time.monotonic() - started, ray_dir


@pytest.mark.parametrize("case", ["missing input", "zero-byte input", "no such bucket"])
def test_bad_input_or_root_fails_before_ray_starts(case, tmp_path, request):
    raw = tmp_path / "raw"
    _corpus(raw)
    overrides = _overrides(tmp_path / "build", raw)
    if case == "missing input":
        overrides.append(f"input.s2={tmp_path / 'nowhere'}")
        expected = f"required input 'papers' not found at {tmp_path / 'nowhere' / 'papers'}"
    elif case == "zero-byte input":
        (raw / "s2/papers/papers-0000.jsonl.gz").write_bytes(b"")
        expected = "required input 'papers' is empty: its 1 shard(s)"
    else:
        endpoint = request.getfixturevalue("s3_endpoint")
        overrides += ["storage.root=s3://no-such-bucket/build", f"storage.s3_endpoint={endpoint}"]
        expected = "storage.root s3://no-such-bucket/build: bucket 'no-such-bucket' does not exist"

    code, output, _, ray_dir = _cpr_subprocess(tmp_path, *overrides)

    assert code == 2, output
    assert "Traceback" not in output
    [line] = _error_lines(output)
    assert expected in line
    assert not ray_dir.exists()  # Ray never started: the check needed only imports


# -- the stage boundary ------------------------------------------------------------------------


def _raise_input_error(batch: dict) -> dict:
    raise InputError("shard s3://b/x.gz is corrupt: a test")


def _raise_bug(batch: dict) -> dict:
    raise ZeroDivisionError("a bug")


@pytest.mark.usefixtures("ray_session")
def test_user_error_inside_ray_is_one_line_and_a_bug_keeps_its_traceback(tmp_path):
    with pytest.raises(InputError) as caught, user_errors_from_ray(str(tmp_path)):
        ray.data.range(2).map_batches(_raise_input_error).materialize()
    message = str(caught.value)
    assert message.startswith("shard s3://b/x.gz is corrupt: a test (Ray traceback in ")
    assert "\n" not in message
    [log] = tmp_path.glob("cpr-error-*.log")
    assert "_raise_input_error" in log.read_text()

    with pytest.raises(ray.exceptions.RayTaskError, match="ZeroDivisionError"):
        with user_errors_from_ray(str(tmp_path)):
            ray.data.range(2).map_batches(_raise_bug).materialize()
    assert not ray.data.DataContext.get_current().raise_original_map_exception  # restored
