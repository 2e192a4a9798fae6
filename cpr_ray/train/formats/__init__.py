"""The training formats, one module each, read into RAW rows (`read_raw`)."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from cpr_ray.errors import ConfigError, InputError
from cpr_ray.storage.store import Storage, StorageError
from cpr_ray.tables.columns import Column
from cpr_ray.train.examples import DataOptions
from cpr_ray.train.formats import cpr_train as cpr
from cpr_ray.train.formats import msmarco, reasonir, specter, triplets
from cpr_ray.train.formats.common import read_all

FORMATS = ("cpr", "triplets", "msmarco", "reasonir", "specter")

READERS: dict[str, tuple[list[Column], Callable[[pa.Table, str], pa.Table]]] = {
    "triplets": (triplets.COLUMNS, triplets.read),
    "msmarco": (msmarco.COLUMNS, msmarco.read),
    "reasonir": (reasonir.COLUMNS, reasonir.read),
    "specter": (specter.COLUMNS, specter.read),
}


def read_raw(storage: Storage, options: DataOptions) -> tuple[pa.Table, dict[str, int]]:
    """The data as RAW rows, and the rows a format's own selection rule dropped (MS MARCO)."""
    if options.format not in FORMATS:
        raise ConfigError(f"unknown train.format {options.format!r}; known: {', '.join(FORMATS)}")
    try:
        if options.format == "cpr":
            return cpr.read_cpr(storage, options.data), {}
        columns, convert = READERS[options.format]
        dropped = 0

        def counted(table: pa.Table, uri: str) -> pa.Table:
            nonlocal dropped
            out = convert(table, uri)
            dropped += int((out.schema.metadata or {}).get(b"dropped_msmarco_selection", 0))
            return out.replace_schema_metadata(None)

        raw = read_all(storage, options.data, columns, counted)
        if options.format == "reasonir" and options.reasonir_documents:
            raw = reasonir.fill_hq_positives(
                raw, reasonir.bright_documents(storage, options.reasonir_documents)
            )
    except StorageError as exc:  # a path that is not there: the user's data, not our storage
        raise InputError(str(exc)) from None
    return raw, ({"dropped_msmarco_selection": dropped} if options.format == "msmarco" else {})
