"""The method's filters over RAW training rows (App. I: non-empty texts, the positive not among
its negatives, distinct negatives), the held-out domain, the sample, the negatives cap and each
query's content-word count: RAW → EXAMPLES, with what was dropped counted by reason."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.errors import ConfigError
from cpr_ray.queries.content_words import content_word_counts
from cpr_ray.train.examples import EXAMPLES, DataOptions
from cpr_ray.train.formats.common import list_array, list_parts, parent_rows


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

    offsets, negatives = list_parts(raw.column("negatives"))
    parents = parent_rows(offsets)
    empty_negative = np.bincount(parents[empty(negatives)], minlength=n) > 0
    empty_text = empty(raw.column("query")) | empty(raw.column("positive")) | empty_negative
    _drop(empty_text, "empty_text", keep, stats)
    keys = list_parts(raw.column("negative_keys"))[1].to_numpy()
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
    offsets, negatives = list_parts(table.column("negatives"))
    keys = list_parts(table.column("negative_keys"))[1]
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
            "negatives": list_array(offsets, negatives),
            "positive_key": table.column("positive_key"),
            "negative_keys": list_array(offsets, keys),
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
