"""The internal form of training data (``EXAMPLES``: one row per query with its positive, hard
negatives, document keys, content-word count, field and domain), what a format's reader returns
(``RAW``), and the options that shape the examples."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import pyarrow as pa

from cpr_ray.config import TrainConfig, TrainFormat
from cpr_ray.errors import ConfigError
from cpr_ray.queries.content_words import STOP_WORDS
from cpr_ray.sections import derive

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
    """What shapes the examples: the format, where the data is, and the method's switches, by
    the `train:` section's names (checked there)."""

    format: TrainFormat
    data: str
    reasonir_documents: str | None = None
    samples: int | None = None
    seed: int = 42
    hold_out_domain: str | None = None
    in_batch_only: bool = False
    negatives: int | None = None
    cw_stop_words: tuple[str, ...] | None = None  # None: the built-in English list

    @classmethod
    def from_config(cls, train: TrainConfig) -> DataOptions:
        if train.data is None:
            raise ConfigError("invalid config: train.data: required but not set (give --data)")
        return derive(cls, train)

    @property
    def stop_words(self) -> tuple[str, ...]:
        """The stop words content words are counted without."""
        return self.cw_stop_words or STOP_WORDS


def fingerprint(examples: pa.Table) -> str:
    """A digest of the examples' content, so a resumed run can tell it trains on the same data."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, examples.schema) as writer:
        writer.write_table(examples.combine_chunks())
    return hashlib.sha256(sink.getvalue()).hexdigest()[:16]
