"""What an index is built from: any of our corpora, or a BEIR corpus, as one table of documents.

Three inputs, told apart by what is at the URI:

- a BEIR ``corpus.jsonl`` (``_id``, ``title``, ``text``; or a folder holding one): ids are kept as
  given (strings), no field or year is known;
- our export (a folder with a ``corpus`` table): S2 corpus ids, title and abstract, year, field,
  domain and topics;
- the build's Lance ``papers`` table (its URI, or the build root whose ingest manifest names it,
  at the version the manifest records):
  the same columns for the whole corpus, before any sampling.

Every document is encoded as evaluation encodes it, so search and `cpr eval` see the same
vectors: our papers as the one paper text (``document_texts``), a BEIR document as BEIR's title
and text (``beir_texts``, as MTEB joins them).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.corpus.tables import PinnedTable
from cpr_ray.errors import InputError, StorageError
from cpr_ray.evaluate.loaders.beir import beir_texts
from cpr_ray.retrieval.base import document_texts
from cpr_ray.runs.stage_runner import manifest_uri, require_manifest
from cpr_ray.stages import INGEST
from cpr_ray.storage import leases
from cpr_ray.storage.store import Storage, join
from cpr_ray.tables.table_files import find_table, read_jsonl

BEIR_FILES = ("corpus.jsonl", "corpus.jsonl.gz")
BEIR_CORPUS = pa.schema([("_id", pa.string()), ("title", pa.string()), ("text", pa.string())])
OUR_COLUMNS = ["corpus_id", "title", "abstract", "year", "field", "domain", "topics"]


@dataclass(frozen=True)
class Documents:
    """`table`: corpus_id (int64, or string for BEIR), title, text, year, field, domain, topics
    (list of topic names); `kind`: beir | export | papers; `uri`: what was read."""

    table: pa.Table
    kind: str
    uri: str

    @property
    def id_type(self) -> str:
        return (
            "string" if pa.types.is_string(self.table.schema.field("corpus_id").type) else "int64"
        )


def content_hashes(texts: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A 64-bit digest of each text: a re-index encodes a document again only when it changed."""
    return np.array(
        [
            int.from_bytes(
                hashlib.blake2b(t.encode(), digest_size=8).digest(), "little", signed=True
            )
            for t in texts.to_pylist()
        ],
        dtype=np.int64,
    )


def _topic_names(topics: pa.ChunkedArray) -> pa.Array:
    arr = topics.combine_chunks()
    names = pc.struct_field(arr.flatten(), "name")
    return pa.ListArray.from_arrays(arr.offsets, names, mask=arr.is_null())


def _ours(table: pa.Table, kind: str, uri: str) -> Documents:
    missing = [c for c in OUR_COLUMNS if c not in table.column_names]
    if missing:
        raise InputError(f"{uri}: a {kind} table needs column(s) {', '.join(missing)}")
    out = pa.table(
        {
            "corpus_id": table.column("corpus_id").cast(pa.int64()),
            "title": pc.fill_null(table.column("title"), ""),
            "text": pa.array(document_texts(table.column("title"), table.column("abstract"))),
            "year": table.column("year").cast(pa.int32()),
            "field": table.column("field"),
            "domain": table.column("domain"),
            "topics": _topic_names(table.column("topics")),
        }
    )
    return Documents(_unique(out, uri), kind, uri)


def _beir(storage: Storage, uri: str) -> Documents:
    corpus = read_jsonl(storage, uri, BEIR_CORPUS)
    n = corpus.num_rows
    out = pa.table(
        {
            "corpus_id": corpus.column("_id"),
            "title": pc.fill_null(corpus.column("title"), ""),
            "text": pa.array(beir_texts(corpus.column("title"), corpus.column("text"))),
            "year": pa.nulls(n, pa.int32()),
            "field": pa.nulls(n, pa.string()),
            "domain": pa.nulls(n, pa.string()),
            "topics": pa.nulls(n, pa.list_(pa.string())),
        }
    )
    return Documents(_unique(out, uri), "beir", uri)


def _unique(table: pa.Table, uri: str) -> pa.Table:
    if table.column("corpus_id").null_count:
        raise InputError(f"{uri}: {table.column('corpus_id').null_count} document(s) have no id")
    if pc.count_distinct(table.column("corpus_id")).as_py() != table.num_rows:
        raise InputError(f"{uri}: document ids are not unique")
    return table


def _lance_table(storage: Storage, uri: str) -> PinnedTable | None:
    """A Lance table given by its own URI (its latest version), or the papers table a build
    root's ingest manifest publishes, at the version it pins (checked as every stage checks it:
    a refresh that stopped before its commit is refused)."""
    if storage.exists(join(uri, "_versions")):
        return PinnedTable(uri)
    root = Storage(storage.cfg.model_copy(update={"root": uri}))
    if storage.is_file(manifest_uri(root, INGEST)):
        return PinnedTable.of(require_manifest(root, INGEST), "papers")
    return None


def load_documents(storage: Storage, uri: str) -> Documents:
    """The documents at `uri` (see the module docstring for what it may be)."""
    storage.check(uri, must_exist=True)
    if uri.endswith((".jsonl", ".jsonl.gz")):
        return _beir(storage, uri)
    for name in BEIR_FILES:
        if storage.is_file(join(uri, name)):
            return _beir(storage, join(uri, name))
    if (table_uri := find_table(storage, uri, "corpus")) is not None:
        return _ours(storage.read_parquet(table_uri), "export", table_uri)
    if (papers := _lance_table(storage, uri)) is not None:
        with leases.reading(storage, papers.uri):  # a build root's: no refresh cleans it meanwhile
            return _ours(papers.read(storage, OUR_COLUMNS), "papers", papers.uri)
    raise StorageError(
        f"{uri} holds no corpus to index: expected a BEIR corpus.jsonl, an export folder with a "
        "corpus table, a Lance papers table, or a build root (ingest/_MANIFEST.json)"
    )
