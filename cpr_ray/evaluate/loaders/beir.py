"""BEIR format: ``corpus.jsonl`` (_id, title, text), ``queries.jsonl`` (_id, text) and
``qrels/{split}.tsv`` (query-id, corpus-id, score; a header line). Retrieval over the whole corpus.
A document's text is its title and text joined by a space, as MTEB joins them (`beir_texts`);
a document or query id listed twice is refused.

Only queries with qrels in the split are evaluated, and a document whose id is the query's id
is never returned (both as BEIR's evaluation does), nor one listed in the query's
``metadata.excluded_ids`` (`cpr to-beir` lists each CPR query's own base paper there: BEIR's ids
cannot, as several queries share one); qrels naming an unknown query
or document are counted in ``rejects``. A ``qrels/train.tsv`` beside it gives (query, relevant
passage) pairs for Query2doc's few-shot examples.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.errors import InputError
from cpr_ray.evaluate.benchmark import Benchmark, positions, qrels_by_position, require_unique
from cpr_ray.storage.store import Storage, StorageError, join
from cpr_ray.tables.table_files import read_jsonl

CORPUS = pa.schema([("_id", pa.string()), ("title", pa.string()), ("text", pa.string())])
QUERIES = pa.schema([("_id", pa.string()), ("text", pa.string())])
EXCLUDED = pa.schema(
    [("_id", pa.string()), ("metadata", pa.struct([("excluded_ids", pa.list_(pa.string()))]))]
)


def beir_texts(title: pa.ChunkedArray, text: pa.ChunkedArray) -> list[str]:
    """Each document's text as MTEB gives it to a model, so a score on a BEIR set compares with
    a published one: ``(title + " " + text).strip()`` where the title is not empty, else
    ``text.strip()`` (mteb 2.26, ``mteb/_create_dataloaders.py``, ``_corpus_to_dict``). CPR
    exports keep the method's "title. abstract" (`load_cpr`)."""
    t = pc.fill_null(title.cast(pa.string()), "")
    x = pc.fill_null(text.cast(pa.string()), "")
    joined = pc.utf8_trim_whitespace(pc.binary_join_element_wise(t, x, " "))
    return pc.if_else(pc.equal(t, ""), pc.utf8_trim_whitespace(x), joined).to_pylist()


def _first(storage: Storage, root: str, names: tuple[str, ...]) -> str:
    for name in names:
        if storage.is_file(join(root, name)):
            return join(root, name)
    raise StorageError(f"{root} is not a BEIR folder: none of {', '.join(names)} found")


def read_qrels(text: str, uri: str) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        parts = line.rstrip("\n").split("\t")
        if n == 1 and not parts[-1].lstrip("-").isdigit():
            continue  # header
        if not line.strip():
            continue
        if len(parts) == 4:  # TREC style: qid 0 docid grade
            parts = [parts[0], parts[2], parts[3]]
        if len(parts) != 3 or not parts[2].strip().lstrip("-").isdigit():
            raise InputError(f"{uri}: line {n} is not 'query-id<TAB>corpus-id<TAB>score'")
        out.setdefault(parts[0], {})[parts[1]] = int(parts[2])
    if not out:
        raise InputError(f"{uri}: no qrels lines")
    return out


def _excluded_ids(storage: Storage, uri: str) -> dict[str, list[str]]:
    """Each query's ``metadata.excluded_ids``; none where the file's metadata has other shapes
    (BEIR leaves ``metadata`` free: other datasets put other things there)."""
    try:
        table = read_jsonl(storage, uri, EXCLUDED)
    except (pa.ArrowInvalid, pa.ArrowTypeError, InputError):
        return {}
    ids = table.column("_id").to_pylist()
    meta = table.column("metadata").to_pylist()
    return {q: m["excluded_ids"] for q, m in zip(ids, meta) if m and m.get("excluded_ids")}


def load_beir(
    storage: Storage, root: str, *, split: str = "test", max_train_pairs: int = 1000
) -> Benchmark:
    corpus_uri = _first(storage, root, ("corpus.jsonl", "corpus.jsonl.gz"))
    corpus = read_jsonl(storage, corpus_uri, CORPUS)
    queries_uri = _first(storage, root, ("queries.jsonl", "queries.jsonl.gz"))
    queries = read_jsonl(storage, queries_uri, QUERIES)
    for table, uri in ((corpus, corpus_uri), (queries, queries_uri)):
        if table.column("_id").null_count:
            raise InputError(f"{uri}: {table.column('_id').null_count} line(s) have no _id")
        require_unique(table.column("_id").to_pylist(), uri)
    qrels_uri = join(root, "qrels", f"{split}.tsv")
    if not storage.is_file(qrels_uri):
        raise StorageError(f"{qrels_uri} not found (BEIR qrels for split {split!r})")
    qrels = read_qrels(storage.read_text(qrels_uri), qrels_uri)

    doc_ids = corpus.column("_id").to_pylist()
    texts = beir_texts(corpus.column("title"), corpus.column("text"))
    index = positions(doc_ids)

    qtext = dict(zip(queries.column("_id").to_pylist(), queries.column("text").to_pylist()))
    rejects = [
        {"query_id": q, "reason": "qrels name a query missing from queries.jsonl"}
        for q in sorted(qrels)
        if q not in qtext
    ]
    query_ids = [q for q in qtext if q in qrels]
    by_pos, missing = qrels_by_position(qrels, query_ids, index)
    if missing:
        rejects.append({"query_id": "*", "reason": f"{missing} qrels name unknown documents"})

    train_pairs: list[tuple[str, str]] = []
    train_uri = join(root, "qrels", "train.tsv")
    if split != "train" and max_train_pairs > 0 and storage.is_file(train_uri):
        for qid, rel in read_qrels(storage.read_text(train_uri), train_uri).items():
            best = [d for d, g in sorted(rel.items(), key=lambda x: -x[1]) if g > 0 and d in index]
            if qid in qtext and best:
                train_pairs.append((qtext[qid], texts[index[best[0]]]))
            if len(train_pairs) >= max_train_pairs:
                break
    # as BEIR's own evaluation: a document with the query's own id is never returned (ArguAna,
    # Quora hold each query in the corpus too); and those its metadata excludes
    listed = _excluded_ids(storage, queries_uri)
    excluded = [
        np.array(sorted({index[d] for d in (q, *listed.get(q, ())) if d in index}), dtype=np.int64)
        for q in query_ids
    ]
    return Benchmark(
        name="beir",
        query_ids=query_ids,
        queries=[qtext[q] or "" for q in query_ids],
        doc_ids=doc_ids,
        doc_texts=texts,
        qrels=by_pos,
        excluded=excluded,
        train_pairs=train_pairs,
        rejects=rejects,
    )
