"""The dataset export format (`../shared/DESIGN.md`, "Dataset export format"), defined once.

The contract between build, training and evaluation: export writes these tables with these
Arrow schemas, `cpr hydrate` rewrites `corpus` in place, and the CPR-eval loader reads them.
"""

from __future__ import annotations

import pyarrow as pa

from cpr_ray.cards.dataset_card import ExportFiles

EVAL_TABLE, TRAIN_TABLE, CORPUS_TABLE = "cpr-eval", "cpr-train", "corpus"
CARD, STATS = "README.md", "stats.json"
POSITIVE = "positive"  # candidate_groups' label of the positive, always first


def file_name(table: str) -> str:
    """Each table is one Parquet file in the export folder, `NAME.parquet`."""
    return f"{table}.parquet"


TOPIC = pa.struct(
    [
        ("id", pa.int32()),
        ("name", pa.string()),
        ("score", pa.float32()),
        ("subfield_id", pa.int32()),
        ("field_id", pa.int32()),
        ("domain_id", pa.int32()),
    ]
)

CORPUS = pa.schema(
    [
        ("corpus_id", pa.int64()),
        ("title", pa.string()),
        ("abstract", pa.string()),  # null where the licence forbids redistribution
        ("abstract_license", pa.string()),
        ("year", pa.int32()),
        ("publication_date", pa.date32()),
        ("topics", pa.list_(TOPIC)),
        ("field", pa.string()),
        ("domain", pa.string()),
    ]
)

CPR_EVAL = pa.schema(
    [
        ("query_id", pa.string()),
        ("query", pa.string()),
        ("base_corpus_id", pa.int64()),
        ("positive_id", pa.int64()),
        ("candidate_ids", pa.list_(pa.int64())),  # the positive, then its negatives, pool order
        ("candidate_groups", pa.list_(pa.string())),  # aligned: positive, shares_query_topic, …
        ("field", pa.string()),
        ("domain", pa.string()),
    ]
)

CPR_TRAIN = pa.schema(
    [
        ("query_id", pa.string()),
        ("query", pa.string()),
        ("base_corpus_id", pa.int64()),
        ("positive_id", pa.int64()),
        ("negative_ids", pa.list_(pa.int64())),
        ("field", pa.string()),
        ("domain", pa.string()),
    ]
)

SCHEMAS = {EVAL_TABLE: CPR_EVAL, TRAIN_TABLE: CPR_TRAIN, CORPUS_TABLE: CORPUS}

# the export's tables and files as its dataset card lists them
EXPORT_FILES = ExportFiles(
    eval_table=EVAL_TABLE,
    train_table=TRAIN_TABLE,
    corpus_table=CORPUS_TABLE,
    files={t: file_name(t) for t in SCHEMAS},
    schemas=SCHEMAS,
    stats=STATS,
)
