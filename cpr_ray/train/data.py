"""Training data: every supported format read into one table of examples, then filtered and
sampled the same way (§4.1, App. I).

The internal form (``EXAMPLES``) is one row per query: its text, its positive, its hard
negatives (possibly none), a key per document (S2 corpus id for CPR, a hash of the text
otherwise: equal keys are the same document, which is how the loss keeps a document from being
a negative of a query it is the positive of), its content-word count, field and domain.

Formats, as their public releases lay them out (one JSONL/Parquet file or a folder of them,
except CPR):

- ``cpr``: a dataset export folder: ``cpr-train`` (query_id, query, base_corpus_id, positive_id,
  negative_ids, field, domain) with texts from ``corpus`` (corpus_id, title, abstract, domain).
- ``triplets``: ``query``, ``positive``, ``negatives`` (list, may be empty or absent); optional
  ``query_id``, ``field``, ``domain``.
- ``msmarco``: MS MARCO v1.1 train: ``query``, ``query_id``, ``passages`` as Hugging Face gives
  it (a struct of lists ``is_selected``, ``passage_text``, ``url``) or as the original JSON does
  (a list of such structs). Queries with exactly one selected passage and at least 9 unselected
  ones; the first 9 unselected are the negatives.
- ``reasonir``: ReasonIR HQ and VL: ``query`` ([instruction, text]), ``pos`` and ``neg`` (lists
  of [instruction, text]); our own instructions replace theirs. HQ positives are BRIGHT
  document ids, filled from ``train.reasonir_documents`` (id, content).
- ``specter``: SciRepEval ``cite_prediction``: ``query``, ``pos``, ``neg`` papers (title,
  abstract); every paper becomes "title. abstract".

A file that breaks its format (a missing column, a wrong type, a null or empty text where one
is required, a line that is not JSON, a CPR id missing from the corpus) raises `InputError`
naming the file, the line or row and the column, before any training. Examples the method leaves
out (an empty text, a positive among its negatives, a repeated negative, an MS MARCO query
without one selected and nine unselected passages, a held-out domain) are dropped and counted
by reason in the stats.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from cpr_ray.config import TrainConfig
from cpr_ray.dataset.format import CORPUS_TABLE, TRAIN_TABLE
from cpr_ray.errors import ConfigError, InputError
from cpr_ray.queries.cw import STOP_WORDS, content_word_counts
from cpr_ray.schemas import paper_text
from cpr_ray.storage import Storage, StorageError, find_table

FORMATS = ("cpr", "triplets", "msmarco", "reasonir", "specter")
FILE_SUFFIXES = (".parquet", ".jsonl", ".jsonl.gz", ".json")
MSMARCO_NEGATIVES = 9  # first unselected passages kept; a query needs at least this many

EXAMPLES = pa.schema(
    [
        ("query_id", pa.string()),
        ("query", pa.string()),
        ("positive", pa.string()),
        ("negatives", pa.list_(pa.string())),
        ("positive_key", pa.int64()),
        ("negative_keys", pa.list_(pa.int64())),
        ("cw", pa.int32()),
        ("field", pa.string()),
        ("domain", pa.string()),
    ]
)
# what a reader returns: EXAMPLES without cw, plus the positive's own domain (CPR)
RAW = pa.schema(
    [f for f in EXAMPLES if f.name != "cw"] + [pa.field("positive_domain", pa.string())]
)


@dataclass(frozen=True)
class DataOptions:
    """What shapes the examples: the format, where the data is, and the method's switches."""

    format: str
    data: str
    reasonir_documents: str | None = None
    samples: int | None = None
    seed: int = 42
    hold_out_domain: str | None = None
    in_batch_only: bool = False
    negatives: int | None = None
    stop_words: tuple[str, ...] = STOP_WORDS

    @classmethod
    def from_config(cls, train: TrainConfig) -> DataOptions:
        if train.data is None:
            raise ConfigError("invalid config: train.data: required but not set (give --data)")
        return cls(
            format=train.format,
            data=train.data,
            reasonir_documents=train.reasonir_documents,
            samples=train.samples,
            seed=train.seed,
            hold_out_domain=train.hold_out_domain,
            in_batch_only=train.in_batch_only,
            negatives=train.negatives,
            stop_words=train.cw_stop_words or STOP_WORDS,
        )


# -- reading and checking files ------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    """A column's expected type: as Arrow reads it, and as a JSON value (to find the line of a
    file Arrow could not read)."""

    name: str
    arrow: Callable[[pa.DataType], bool]
    json: Callable[[Any], bool]


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _is_list_of(inner: Callable[[pa.DataType], bool]) -> Callable[[pa.DataType], bool]:
    return lambda t: (pa.types.is_list(t) or pa.types.is_large_list(t)) and inner(t.value_type)


def _json_list_of(inner: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and all(x is None or inner(x) for x in v)


def _json_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _json_paper(v: Any) -> bool:
    return isinstance(v, dict) and all(
        v.get(k) is None or isinstance(v.get(k), str) for k in ("title", "abstract")
    )


def _is_paper(t: pa.DataType) -> bool:
    return pa.types.is_struct(t) and all(
        t.get_field_index(k) < 0 or _is_text(t.field(k).type) or pa.types.is_null(t.field(k).type)
        for k in ("title", "abstract")
    )


def _is_passages(t: pa.DataType) -> bool:
    """MS MARCO passages: a struct of aligned lists (Hugging Face) or a list of structs."""
    struct = t.value_type if _is_list_of(pa.types.is_struct)(t) else t
    if not pa.types.is_struct(struct):
        return False
    sel, text = struct.get_field_index("is_selected"), struct.get_field_index("passage_text")
    if sel < 0 or text < 0:
        return False
    sel_t, text_t = struct.field(sel).type, struct.field(text).type
    if struct is t:  # struct of lists
        return _is_list_of(pa.types.is_integer)(sel_t) and _is_list_of(_is_text)(text_t)
    return pa.types.is_integer(sel_t) and _is_text(text_t)


def _json_passages(v: Any) -> bool:
    if isinstance(v, dict):
        return _json_list_of(_json_int)(v.get("is_selected")) and _json_list_of(
            lambda x: isinstance(x, str)
        )(v.get("passage_text"))
    return isinstance(v, list) and all(
        isinstance(p, dict)
        and _json_int(p.get("is_selected"))
        and isinstance(p.get("passage_text"), str)
        for p in v
    )


def _json_str(v: Any) -> bool:
    return isinstance(v, str)


TEXT = Kind("text", _is_text, _json_str)
TEXTS = Kind("a list of texts", _is_list_of(_is_text), _json_list_of(_json_str))
INT = Kind("an integer", pa.types.is_integer, _json_int)
INTS = Kind("a list of integers", _is_list_of(pa.types.is_integer), _json_list_of(_json_int))
ID = Kind(
    "text or an integer",
    lambda t: _is_text(t) or pa.types.is_integer(t),
    lambda v: isinstance(v, str) or _json_int(v),
)
PAPER = Kind("a paper (title, abstract)", _is_paper, _json_paper)
PASSAGES = Kind("MS MARCO passages (is_selected, passage_text)", _is_passages, _json_passages)
# ReasonIR: a query is [instruction, text] (or a text); pos/neg are lists of those
TEXT_OR_PAIR = Kind(
    "text or [instruction, text]",
    lambda t: _is_text(t) or _is_list_of(_is_text)(t),
    lambda v: isinstance(v, str) or _json_list_of(_json_str)(v),
)
PAIRS = Kind(
    "a list of [instruction, text]",
    lambda t: _is_list_of(_is_list_of(_is_text))(t) or _is_list_of(_is_text)(t),
    lambda v: (
        isinstance(v, list) and all(isinstance(x, str) or _json_list_of(_json_str)(x) for x in v)
    ),
)


@dataclass(frozen=True)
class Column:
    name: str
    kind: Kind
    required: bool = True  # present and not null in every record
    nonempty: bool = False  # a text that must not be empty (after trimming)


def _line_numbers(data: bytes) -> np.ndarray:
    """1-based line number of each record of a JSONL file (blank lines hold none)."""
    lines = data.decode("utf-8").splitlines()
    return np.array([i for i, line in enumerate(lines, start=1) if line.strip()], np.int64)


def _where(uri: str, data: bytes | None, row: int) -> str:
    """`FILE line N` (JSONL) or `FILE row N` (Parquet, 1-based) of a record."""
    if data is None:
        return f"{uri} row {row + 1}"
    return f"{uri} line {int(_line_numbers(data)[row])}"


def _locate_json_problem(uri: str, data: bytes, columns: list[Column]) -> InputError:
    """The first line of a JSONL file Arrow could not read, and why."""
    for n, line in enumerate(data.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            return InputError(f"{uri} line {n}: not valid JSON ({exc.msg})")
        if not isinstance(rec, dict):
            return InputError(f"{uri} line {n}: not a JSON object")
        for col in columns:
            value = rec.get(col.name)
            if value is not None and not col.kind.json(value):
                return InputError(
                    f"{uri} line {n}: column {col.name!r} holds {type(value).__name__}, "
                    f"expected {col.kind.name}"
                )
    return InputError(f"{uri}: cannot be read as JSON lines")


def _check(table: pa.Table, uri: str, data: bytes | None, columns: list[Column]) -> None:
    """Raise on the first column that is missing, of the wrong type, null or empty."""
    for col in columns:
        if col.name not in table.column_names:
            if col.required:
                raise InputError(f"{uri}: missing column {col.name!r} ({col.kind.name})")
            continue
        values = table.column(col.name)
        if pa.types.is_null(values.type):  # null in every record (JSON lines)
            if col.required and table.num_rows:
                raise InputError(f"{_where(uri, data, 0)}: column {col.name!r} is null")
            continue
        if not col.kind.arrow(values.type):
            raise InputError(
                f"{_where(uri, data, 0)}: column {col.name!r} holds {values.type}, expected "
                f"{col.kind.name}"
            )
        if col.required and values.null_count:
            row = int(np.flatnonzero(pc.is_null(values).to_numpy(zero_copy_only=False))[0])
            raise InputError(f"{_where(uri, data, row)}: column {col.name!r} is missing or null")
        if col.nonempty:
            empty = pc.equal(pc.utf8_trim_whitespace(values), "").to_numpy(zero_copy_only=False)
            if empty.any():
                row = int(np.flatnonzero(empty)[0])
                raise InputError(f"{_where(uri, data, row)}: column {col.name!r} is empty")


def _read_file(storage: Storage, uri: str, columns: list[Column]) -> pa.Table:
    """One Parquet or JSON-lines file, checked against `columns`."""
    data: bytes | None = None
    if uri.endswith(".parquet"):
        table = storage.read_parquet(uri)
    else:
        data = storage.read_bytes(uri)
        try:
            # blocks large enough for any one record (a block boundary inside a line fails)
            options = pajson.ReadOptions(block_size=max(1 << 20, min(len(data), 1 << 28)))
            table = (
                pajson.read_json(pa.BufferReader(data), read_options=options)
                if data.strip()
                else pa.table({})
            )
        except pa.ArrowInvalid:
            raise _locate_json_problem(uri, data, columns) from None
    _check(table, uri, data, columns)
    return table


def data_files(storage: Storage, uri: str) -> list[str]:
    """`uri` itself when it is a file, else the table files under the folder."""
    if storage.is_file(uri):
        return [uri]
    storage.check(uri, must_exist=True)
    loc = storage.resolve(uri)
    files = [
        f"{uri.rstrip('/')}/{posixpath.relpath(i.path, loc.path)}"
        for i in storage.list_files(uri, FILE_SUFFIXES)
    ]
    if not files:
        raise InputError(f"{uri}: no {', '.join(FILE_SUFFIXES)} files")
    return files


def _read_all(
    storage: Storage, uri: str, columns: list[Column], convert: Callable[[pa.Table, str], pa.Table]
) -> pa.Table:
    """Every file under `uri`, each checked and converted to RAW on its own (errors name it)."""
    parts = [convert(_read_file(storage, f, columns), f) for f in data_files(storage, uri)]
    return pa.concat_tables(parts) if parts else RAW.empty_table()


# -- texts, keys and list columns -------------------------------------------------------------


def text_keys(texts: pa.Array | pa.ChunkedArray) -> pa.Array:
    """int64 key per text: equal texts, equal keys (polars' vectorised 64-bit hash)."""
    series = pl.from_arrow(_array(texts).cast(pa.string()))
    return pa.array(series.hash(seed=0).to_numpy().view(np.int64), pa.int64())


def _array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def _strings(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    return _array(values).cast(pa.string())


def _flat(values: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, pa.Array]:
    """(offsets, values) of a list column, a null list as an empty one.

    Rebuilt from the lengths, since a sliced Arrow list array keeps offsets into values it no
    longer holds.
    """
    arr = _array(values)
    lengths = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False)
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), pc.list_flatten(arr)


def _lists(offsets: np.ndarray, values: pa.Array) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)


def _parents(offsets: np.ndarray) -> np.ndarray:
    """The row of each flat value."""
    return np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))


def _has_column(table: pa.Table, column: str) -> bool:
    return column in table.column_names and not pa.types.is_null(table.schema.field(column).type)


def _optional_strings(table: pa.Table, column: str) -> pa.Array:
    if _has_column(table, column):
        return _strings(table.column(column))
    return pa.nulls(table.num_rows, pa.string())


def _text_lists(table: pa.Table, column: str) -> pa.Array:
    """A list-of-texts column as list<string>; absent or null: empty lists."""
    if not _has_column(table, column):
        return _lists(np.zeros(table.num_rows + 1, np.int64), pa.array([], pa.string()))
    offsets, flat = _flat(table.column(column))
    return _lists(offsets, _strings(flat))


def _text_table(
    table: pa.Table, uri: str, query: pa.Array, positive: pa.Array, negatives: pa.Array
) -> pa.Table:
    """RAW from texts; query ids, field and domain from the file's own columns where it has
    them (an id defaults to `FILE:N`, N the record's 1-based position)."""
    n = len(query)
    name = posixpath.basename(uri)
    qid = _optional_strings(table, "query_id")
    default_ids = pa.array([f"{name}:{i + 1}" for i in range(n)], pa.string())
    offsets, flat = _flat(negatives)
    return pa.table(
        {
            "query_id": pc.if_else(pc.is_null(qid), default_ids, qid),
            "query": query,
            "positive": positive,
            "negatives": _lists(offsets, flat),
            "positive_key": text_keys(positive),
            "negative_keys": _lists(offsets, text_keys(flat)),
            "field": _optional_strings(table, "field"),
            "domain": _optional_strings(table, "domain"),
            "positive_domain": pa.nulls(n, pa.string()),
        },
        schema=RAW,
    )


def _last_of_pairs(values: pa.Array, rows: np.ndarray, uri: str, column: str) -> pa.Array:
    """The last element of each list (ReasonIR's [instruction, text] -> text); `rows` is the
    record each list belongs to, for the error."""
    offsets, flat = _flat(values)
    lengths = np.diff(offsets)
    if (lengths == 0).any():
        row = int(rows[np.flatnonzero(lengths == 0)[0]])
        raise InputError(f"{_where(uri, None, row)}: column {column!r} holds an empty pair")
    return _strings(flat.take(pa.array(offsets[1:] - 1)))


# -- the formats -----------------------------------------------------------------------------

TRIPLET_COLUMNS = [
    Column("query", TEXT, nonempty=True),
    Column("positive", TEXT, nonempty=True),
    Column("negatives", TEXTS, required=False),
    Column("query_id", ID, required=False),
    Column("field", TEXT, required=False),
    Column("domain", TEXT, required=False),
]


def _triplets(table: pa.Table, uri: str) -> pa.Table:
    query, positive = _strings(table.column("query")), _strings(table.column("positive"))
    return _text_table(table, uri, query, positive, _text_lists(table, "negatives"))


MSMARCO_COLUMNS = [
    Column("query", TEXT),
    Column("passages", PASSAGES),
    Column("query_id", ID, required=False),
]


def _msmarco(table: pa.Table, uri: str) -> pa.Table:
    passages = _array(table.column("passages"))
    n = table.num_rows
    if pa.types.is_struct(passages.type):  # Hugging Face: a struct of aligned lists
        offsets, sel = _flat(passages.field("is_selected"))
        text_offsets, texts = _flat(passages.field("passage_text"))
        if not np.array_equal(offsets, text_offsets):
            row = int(np.flatnonzero(np.diff(offsets) != np.diff(text_offsets))[0])
            raise InputError(
                f"{_where(uri, None, row)}: column 'passages': is_selected and passage_text "
                "differ in length"
            )
    else:  # the original JSON: a list of passage objects
        offsets, flat = _flat(passages)
        sel, texts = flat.field("is_selected"), flat.field("passage_text")
    parents = _parents(offsets)
    selected = pc.fill_null(pc.equal(sel, 1), False).to_numpy(zero_copy_only=False)
    n_sel = np.bincount(parents[selected], minlength=n)
    unsel = np.flatnonzero(~selected)  # flat positions, in row order then passage order
    unsel_rows = parents[unsel]
    rank = np.arange(len(unsel)) - np.searchsorted(unsel_rows, unsel_rows)  # among the row's
    keep = (n_sel == 1) & (np.bincount(unsel_rows, minlength=n) >= MSMARCO_NEGATIVES)
    rows = np.flatnonzero(keep)
    positive_at = np.flatnonzero(selected)[keep[parents[selected]]]  # one per kept row
    negative_at = unsel[(rank < MSMARCO_NEGATIVES) & keep[unsel_rows]]  # nine per kept row
    kept = table.take(pa.array(rows, pa.int64()))
    negatives = _lists(
        np.arange(len(rows) + 1) * MSMARCO_NEGATIVES,
        _strings(texts.take(pa.array(negative_at, pa.int64()))),
    )
    positive = _strings(texts.take(pa.array(positive_at, pa.int64())))
    out = _text_table(kept, uri, _strings(kept.column("query")), positive, negatives)
    return out.replace_schema_metadata({"dropped_msmarco_selection": str(n - len(rows))})


REASONIR_COLUMNS = [
    Column("query", TEXT_OR_PAIR),
    Column("pos", PAIRS),
    Column("neg", PAIRS, required=False),
]


def _reasonir_query(table: pa.Table, uri: str) -> pa.Array:
    arr = _array(table.column("query"))
    if _is_text(arr.type):
        return _strings(arr)
    return _last_of_pairs(arr, np.arange(len(arr)), uri, "query")


def _reasonir_docs(table: pa.Table, uri: str, column: str) -> pa.Array:
    """A list of [instruction, text] (or of texts) per record -> a list of texts per record."""
    if not _has_column(table, column):
        return _text_lists(table, column)
    offsets, items = _flat(table.column(column))
    if _is_text(items.type):
        return _lists(offsets, _strings(items))
    return _lists(offsets, _last_of_pairs(items, _parents(offsets), uri, column))


def _reasonir(table: pa.Table, uri: str) -> pa.Table:
    pos = _reasonir_docs(table, uri, "pos")
    offsets, flat = _flat(pos)
    if (np.diff(offsets) == 0).any():
        row = int(np.flatnonzero(np.diff(offsets) == 0)[0])
        raise InputError(f"{_where(uri, None, row)}: column 'pos' holds no positive")
    positive = flat.take(pa.array(offsets[:-1]))  # the first positive of each record
    query = _reasonir_query(table, uri)
    return _text_table(table, uri, query, positive, _reasonir_docs(table, uri, "neg"))


SPECTER_COLUMNS = [
    Column("query", PAPER),
    Column("pos", PAPER),
    Column("neg", PAPER),
]


def _paper_column(table: pa.Table, column: str) -> pa.Array:
    papers = _array(table.column(column))
    n = len(papers)
    parts = [
        _strings(papers.field(k))
        if papers.type.get_field_index(k) >= 0
        else pa.nulls(n, pa.string())
        for k in ("title", "abstract")
    ]
    return paper_text(*parts)


def _specter(table: pa.Table, uri: str) -> pa.Table:
    neg = _paper_column(table, "neg")
    negatives = _lists(np.arange(len(neg) + 1), neg)
    query, positive = _paper_column(table, "query"), _paper_column(table, "pos")
    return _text_table(table, uri, query, positive, negatives)


CPR_TRAIN_COLUMNS = [
    Column("query_id", TEXT),
    Column("query", TEXT, nonempty=True),
    Column("positive_id", INT),
    Column("negative_ids", INTS),
    Column("field", TEXT, required=False),
    Column("domain", TEXT, required=False),
]
CORPUS_COLUMNS = [
    Column("corpus_id", INT),
    Column("title", TEXT, required=False),
    Column("abstract", TEXT, required=False),
    Column("domain", TEXT, required=False),
]


@dataclass(frozen=True)
class _Corpus:
    """Paper texts and domains by corpus id (ids sorted)."""

    uri: str
    ids: np.ndarray
    texts: pa.Array
    domains: pa.Array

    @classmethod
    def read(cls, storage: Storage, uri: str) -> _Corpus:
        parts = []
        for f in data_files(storage, uri):
            t = _read_file(storage, f, CORPUS_COLUMNS)
            parts.append(
                pa.table(
                    {
                        "corpus_id": _array(t.column("corpus_id")).cast(pa.int64()),
                        "text": paper_text(
                            _optional_strings(t, "title"), _optional_strings(t, "abstract")
                        ),
                        "domain": _optional_strings(t, "domain"),
                    }
                )
            )
        corpus = pa.concat_tables(parts)
        ids = corpus.column("corpus_id").to_numpy()
        order = pa.array(np.argsort(ids, kind="stable"))
        return cls(
            uri,
            ids[order.to_numpy()],
            _array(corpus.column("text")).take(order),
            _array(corpus.column("domain")).take(order),
        )

    def positions(self, wanted: np.ndarray, rows: np.ndarray, uri: str, column: str) -> pa.Array:
        """Where each wanted id is; the first one missing raises, naming its record."""
        at = np.searchsorted(self.ids, wanted).clip(max=max(len(self.ids) - 1, 0))
        found = self.ids[at] == wanted if len(self.ids) else np.zeros(len(wanted), bool)
        if not found.all():
            i = int(np.flatnonzero(~found)[0])
            raise InputError(
                f"{_where(uri, None, int(rows[i]))}: column {column!r}: paper {int(wanted[i])} "
                f"is not in the corpus {self.uri}"
            )
        return pa.array(at, pa.int64())


def _cpr_file(table: pa.Table, uri: str, corpus: _Corpus) -> pa.Table:
    n = table.num_rows
    pos = _array(table.column("positive_id")).cast(pa.int64()).to_numpy()
    offsets, flat = _flat(table.column("negative_ids"))
    if flat.null_count:
        row = int(_parents(offsets)[pc.is_null(flat).to_numpy(zero_copy_only=False)][0])
        raise InputError(f"{_where(uri, None, row)}: column 'negative_ids' holds a null id")
    neg = flat.cast(pa.int64()).to_numpy()
    pos_at = corpus.positions(pos, np.arange(n), uri, "positive_id")
    neg_at = corpus.positions(neg, _parents(offsets), uri, "negative_ids")
    return pa.table(
        {
            "query_id": _strings(table.column("query_id")),
            "query": _strings(table.column("query")),
            "positive": corpus.texts.take(pos_at),
            "negatives": _lists(offsets, corpus.texts.take(neg_at)),
            "positive_key": pa.array(pos, pa.int64()),
            "negative_keys": _lists(offsets, pa.array(neg, pa.int64())),
            "field": _optional_strings(table, "field"),
            "domain": _optional_strings(table, "domain"),
            "positive_domain": corpus.domains.take(pos_at),
        },
        schema=RAW,
    )


def _read_cpr(storage: Storage, root: str) -> pa.Table:
    train_uri = find_table(storage, root, TRAIN_TABLE)
    corpus_uri = find_table(storage, root, CORPUS_TABLE)
    if train_uri is None or corpus_uri is None:
        missing = [t for t, u in ((TRAIN_TABLE, train_uri), (CORPUS_TABLE, corpus_uri)) if not u]
        raise InputError(
            f"{root} is not a CPR export: no {' or '.join(missing)} table "
            "(expected NAME.parquet or a NAME/ folder of Parquet files)"
        )
    corpus = _Corpus.read(storage, corpus_uri)
    return _read_all(
        storage, train_uri, CPR_TRAIN_COLUMNS, lambda t, uri: _cpr_file(t, uri, corpus)
    )


def _bright_documents(storage: Storage, uri: str) -> pa.Table:
    columns = [Column("id", ID), Column("content", TEXT)]
    parts = []
    for f in data_files(storage, uri):
        t = _read_file(storage, f, columns)
        parts.append(
            pa.table({"id": _strings(t.column("id")), "content": _strings(t.column("content"))})
        )
    return pa.concat_tables(parts)


def _fill_hq_positives(raw: pa.Table, documents: pa.Table) -> pa.Table:
    """HQ positives that are BRIGHT document ids -> those documents' text (and their keys)."""
    positive = raw.column("positive")
    at = pc.index_in(positive, value_set=_array(documents.column("id")))
    content = _array(documents.column("content")).take(pc.fill_null(at, 0))
    filled = _array(pc.if_else(pc.is_null(at), positive, content))
    raw = raw.set_column(raw.schema.get_field_index("positive"), "positive", filled)
    index = raw.schema.get_field_index("positive_key")
    return raw.set_column(index, "positive_key", text_keys(filled))


READERS: dict[str, tuple[list[Column], Callable[[pa.Table, str], pa.Table]]] = {
    "triplets": (TRIPLET_COLUMNS, _triplets),
    "msmarco": (MSMARCO_COLUMNS, _msmarco),
    "reasonir": (REASONIR_COLUMNS, _reasonir),
    "specter": (SPECTER_COLUMNS, _specter),
}


def read_raw(storage: Storage, options: DataOptions) -> tuple[pa.Table, dict[str, int]]:
    """The data as RAW rows, and the rows a format's own selection rule dropped (MS MARCO)."""
    if options.format not in FORMATS:
        raise ConfigError(f"unknown train.format {options.format!r}; known: {', '.join(FORMATS)}")
    try:
        if options.format == "cpr":
            return _read_cpr(storage, options.data), {}
        columns, convert = READERS[options.format]
        dropped = 0

        def counted(table: pa.Table, uri: str) -> pa.Table:
            nonlocal dropped
            out = convert(table, uri)
            dropped += int((out.schema.metadata or {}).get(b"dropped_msmarco_selection", 0))
            return out.replace_schema_metadata(None)

        raw = _read_all(storage, options.data, columns, counted)
        if options.format == "reasonir" and options.reasonir_documents:
            raw = _fill_hq_positives(raw, _bright_documents(storage, options.reasonir_documents))
    except StorageError as exc:  # a path that is not there: the user's data, not our storage
        raise InputError(str(exc)) from None
    return raw, ({"dropped_msmarco_selection": dropped} if options.format == "msmarco" else {})


# -- the method's filters, sampling and CW -----------------------------------------------------


def _drop(mask: np.ndarray, reason: str, keep: np.ndarray, stats: dict[str, int]) -> None:
    newly = mask & keep
    stats[f"dropped_{reason}"] = int(newly.sum())
    keep &= ~mask


def prepare(raw: pa.Table, options: DataOptions) -> tuple[pa.Table, dict[str, Any]]:
    """RAW rows -> EXAMPLES: the method's filters, the held-out domain, the sample, the
    negatives cap (none when in-batch only) and each query's content-word count."""
    n = raw.num_rows
    stats: dict[str, Any] = {"rows_read": n}
    keep = np.ones(n, bool)

    def empty(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
        trimmed = pc.utf8_trim_whitespace(pc.fill_null(values, ""))
        return pc.equal(trimmed, "").to_numpy(zero_copy_only=False)

    offsets, negatives = _flat(raw.column("negatives"))
    parents = _parents(offsets)
    empty_negative = np.bincount(parents[empty(negatives)], minlength=n) > 0
    empty_text = empty(raw.column("query")) | empty(raw.column("positive")) | empty_negative
    _drop(empty_text, "empty_text", keep, stats)
    keys = _flat(raw.column("negative_keys"))[1].to_numpy()
    positive_keys = raw.column("positive_key").to_numpy()
    among = np.bincount(parents[keys == positive_keys[parents]], minlength=n) > 0
    _drop(among, "positive_among_negatives", keep, stats)
    order = np.lexsort((keys, parents))  # by row, then key: a repeat sits next to its twin
    twin = (np.diff(parents[order]) == 0) & (np.diff(keys[order]) == 0)
    repeated = np.bincount(parents[order][1:][twin], minlength=n) > 0
    _drop(repeated, "repeated_negatives", keep, stats)
    if options.hold_out_domain is not None:
        _drop(_held_out(raw, options), "held_out_domain", keep, stats)

    rows = np.flatnonzero(keep)
    stats["eligible"] = len(rows)
    if options.samples is not None and options.samples < len(rows):
        rng = np.random.default_rng(options.seed)
        rows = np.sort(rng.choice(rows, options.samples, replace=False))
    stats["examples"] = len(rows)
    table = raw.take(pa.array(rows, pa.int64()))

    cap = 0 if options.in_batch_only else options.negatives
    offsets, negatives = _flat(table.column("negatives"))
    keys = _flat(table.column("negative_keys"))[1]
    if cap is not None:
        slot = np.arange(offsets[-1]) - np.repeat(offsets[:-1], np.diff(offsets))
        taken = pa.array(np.flatnonzero(slot < cap), pa.int64())
        negatives, keys = negatives.take(taken), keys.take(taken)
        offsets = np.concatenate([[0], np.cumsum(np.minimum(np.diff(offsets), cap))])
    cw = content_word_counts(table.column("query").to_pylist(), options.stop_words)
    out = pa.table(
        {
            "query_id": table.column("query_id"),
            "query": table.column("query"),
            "positive": table.column("positive"),
            "negatives": _lists(offsets, negatives),
            "positive_key": table.column("positive_key"),
            "negative_keys": _lists(offsets, keys),
            "cw": pa.array(cw, pa.int32()),
            "field": table.column("field"),
            "domain": table.column("domain"),
        },
        schema=EXAMPLES,
    )
    lengths = np.diff(offsets)
    stats["max_negatives"] = int(lengths.max()) if len(lengths) else 0
    stats["mean_negatives"] = round(float(lengths.mean()), 3) if len(lengths) else 0.0
    return out, stats


def _held_out(raw: pa.Table, options: DataOptions) -> np.ndarray:
    """Rows whose query or positive is of the held-out domain (which the data must name)."""
    columns = [raw.column("domain"), raw.column("positive_domain")]
    known = sorted({d for c in columns for d in pc.unique(c).to_pylist() if d})
    if not known:
        raise ConfigError(
            f"invalid config: train.hold_out_domain: the {options.format} data names no domains "
            "(CPR exports do; a triplets file may have a domain column)"
        )
    if options.hold_out_domain not in known:
        raise ConfigError(
            f"invalid config: train.hold_out_domain: {options.hold_out_domain!r} is not a "
            f"domain of this data; known: {', '.join(known)}"
        )
    held = np.zeros(raw.num_rows, bool)
    for c in columns:
        held |= pc.fill_null(pc.equal(c, options.hold_out_domain), False).to_numpy(
            zero_copy_only=False
        )
    return held


def read_examples(storage: Storage, options: DataOptions) -> tuple[pa.Table, dict[str, Any]]:
    """The training examples of `options.data` in the internal form, and what was dropped."""
    raw, dropped = read_raw(storage, options)
    examples, stats = prepare(raw, options)
    return examples, {"format": options.format, "data": options.data, **dropped, **stats}


def fingerprint(examples: pa.Table) -> str:
    """A digest of the examples' content, so a resumed run can tell it trains on the same data."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, examples.schema) as writer:
        writer.write_table(examples.combine_chunks())
    return hashlib.sha256(sink.getvalue()).hexdigest()[:16]
