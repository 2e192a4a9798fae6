"""`cpr hydrate`: fill the abstracts an export leaves out from the user's own S2 abstracts.

An export carries an abstract only under an open licence; the others are ids and titles. A user
who holds the Semantic Scholar `abstracts` dataset (their own licence to it) fills them in place:
the shards are streamed a chunk at a time and parsed by the same record rules as ingest, only
the ids the corpus lacks are kept, and the newest record of an id wins, as in ingest.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.corpus.inputs import TEXT_SUFFIXES
from cpr_ray.corpus.records import S2_ABSTRACTS, parse_lines
from cpr_ray.corpus.shards import read_shard
from cpr_ray.dataset.format import CORPUS, CORPUS_TABLE, file_name
from cpr_ray.errors import InputError
from cpr_ray.storage.store import Storage, StorageError, join
from cpr_ray.tables import duckdb_sql as duck
from cpr_ray.tables.buckets import BUCKET


def abstracts_folder(storage: Storage, s2: str) -> str:
    """The `abstracts/` folder of an S2 release, or the given folder when it is that folder."""
    nested = join(s2, "abstracts")
    if storage.exists(nested):
        return nested
    if storage.exists(s2):
        return s2
    raise StorageError(f"--s2 {s2}: not found (give the S2 release or its abstracts/ folder)")


def find_abstracts(storage: Storage, folder: str, ids: pa.Array) -> tuple[pa.Table, int]:
    """(corpus_id, abstract) of the given ids in the shards under `folder`, and the shard count.

    Lines that are not valid abstract records are skipped here (ingest quarantines them; this
    only reads what it can use)."""
    loc = storage.resolve(folder)
    shards = [
        f"s3://{i.path}" if loc.is_s3 else i.path for i in storage.list_files(folder, TEXT_SUFFIXES)
    ]
    if not shards:
        raise InputError(f"no abstract shards (*{', *'.join(TEXT_SUFFIXES)}) under {folder}")
    found = []
    for uri in shards:
        for lines in read_shard(storage, uri):
            rows = parse_lines(lines, S2_ABSTRACTS, num_buckets=1)
            keep = pc.and_(
                pc.greater_equal(rows[BUCKET], 0), pc.is_in(rows["corpus_id"], value_set=ids)
            )
            found.append(rows.filter(keep).select(["corpus_id", "abstract", "updated"]))
    if not found:
        return pa.table(
            {"corpus_id": pa.array([], pa.int64()), "abstract": pa.array([], pa.string())}
        ), len(shards)
    newest = duck.query(
        """SELECT corpus_id, abstract FROM found
           QUALIFY row_number() OVER (PARTITION BY corpus_id
                                      ORDER BY updated DESC NULLS LAST, abstract) = 1""",
        found=pa.concat_tables(found),
    )
    return newest, len(shards)


def hydrate(storage: Storage, export: str, s2: str) -> dict[str, Any]:
    """Fill `export`'s missing abstracts from the S2 abstracts at `s2`; rewrite its corpus
    (atomically) and return the counts."""
    corpus_uri = join(export, file_name(CORPUS_TABLE))
    if not storage.is_file(corpus_uri):
        raise StorageError(f"{export} is not a CPR export: no {file_name(CORPUS_TABLE)}")
    corpus = storage.read_parquet(corpus_uri)
    missing = corpus.filter(pc.is_null(corpus["abstract"]))["corpus_id"].combine_chunks()
    folder = abstracts_folder(storage, s2)
    found, n_shards = find_abstracts(storage, folder, missing) if len(missing) else (None, 0)
    filled = 0
    if found is not None and found.num_rows:
        corpus = duck.query(
            """SELECT c.* REPLACE (coalesce(c.abstract, f.abstract) AS abstract)
               FROM (SELECT *, row_number() OVER () AS _row FROM corpus) c
               LEFT JOIN found f USING (corpus_id) ORDER BY c._row""",
            corpus=corpus,
            found=found,
        ).drop_columns(["_row"])
        filled = found.num_rows
        storage.write_parquet(corpus.select(CORPUS.names).cast(CORPUS), corpus_uri)
    return {
        "corpus": corpus_uri,
        "papers": corpus.num_rows,
        "missing": len(missing),
        "filled": filled,
        "still_missing": len(missing) - filled,
        "shards": n_shards,
    }
