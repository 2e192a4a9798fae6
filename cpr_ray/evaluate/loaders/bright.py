"""BRIGHT (Su et al., 2024), StackExchange subsets, each searched over its own corpus.

Layout as in the public dataset: ``documents/`` (id, content) and ``examples/`` (id, query,
gold_ids, excluded_ids, …), one Parquet or JSONL file (or folder) per subset, named for it
(``documents/biology-00000-of-00001.parquet`` or ``documents/biology/0000.parquet``).
Gold documents have grade 1; ``excluded_ids`` are removed from the ranking before scoring, as in
the benchmark's own evaluation.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from cpr_ray.evaluate.benchmark import Benchmark, positions, require_unique
from cpr_ray.storage.store import Storage, StorageError, join
from cpr_ray.tables.table_files import files_under, read_jsonl

STACKEXCHANGE = (
    "biology",
    "earth_science",
    "economics",
    "psychology",
    "robotics",
    "stackoverflow",
    "sustainable_living",
)
DOCUMENTS = pa.schema([("id", pa.string()), ("content", pa.string())])
EXAMPLES = pa.schema(
    [
        ("id", pa.string()),
        ("query", pa.string()),
        ("gold_ids", pa.list_(pa.string())),
        ("excluded_ids", pa.list_(pa.string())),
    ]
)


def _read(storage: Storage, root: str, folder: str, subset: str, schema: pa.Schema) -> pa.Table:
    uris = files_under(storage, join(root, folder), subset)
    if not uris:
        raise StorageError(f"no {folder} file for BRIGHT subset {subset!r} under {root}/{folder}")
    parts = []
    for uri in uris:
        if uri.endswith(".parquet"):
            t = storage.read_parquet(uri)
            cols = [c for c in schema.names if c in t.column_names]
            parts.append(t.select(cols).cast(pa.schema([schema.field(c) for c in cols])))
        else:
            parts.append(read_jsonl(storage, uri, schema))
    return pa.concat_tables(parts, promote_options="default")


def load_bright(storage: Storage, root: str, *, subset: str) -> Benchmark:
    docs = _read(storage, root, "documents", subset, DOCUMENTS)
    examples = _read(storage, root, "examples", subset, EXAMPLES)
    require_unique(docs.column("id").to_pylist(), f"{root}/documents ({subset})")
    require_unique(examples.column("id").to_pylist(), f"{root}/examples ({subset})")
    doc_ids = docs.column("id").to_pylist()
    index = positions(doc_ids)
    query_ids, queries, qrels, excluded = [], [], [], []
    missing_gold = 0
    cols = examples.to_pydict()
    for i in range(examples.num_rows):
        gold = cols["gold_ids"][i] or []
        known = {index[g]: 1 for g in gold if g in index}
        missing_gold += len(gold) - len(known)
        query_ids.append(str(cols["id"][i]))
        queries.append(cols["query"][i] or "")
        qrels.append(known)
        listed = cols.get("excluded_ids", [None] * examples.num_rows)[i] or []
        skip = [index[e] for e in listed if e in index]  # "N/A" and unknown ids name nothing
        excluded.append(np.array(sorted(set(skip) - set(known)), dtype=np.int64))
    rejects = []
    if missing_gold:
        rejects.append({"query_id": "*", "reason": f"{missing_gold} gold ids not in documents"})
    return Benchmark(
        name=f"bright:{subset}",
        query_ids=query_ids,
        queries=queries,
        doc_ids=doc_ids,
        doc_texts=[t or "" for t in docs.column("content").to_pylist()],
        qrels=qrels,
        excluded=excluded,
        rejects=rejects,
        primary_metric="ndcg_at_10",
    )
