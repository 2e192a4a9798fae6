"""Column helpers shared by the tables: constants, masks, concatenation, dates, JSON lines."""

from __future__ import annotations

import numpy as np
import polars as pl


def _constant(value: object, dtype: pl.DataType | type[pl.DataType], n: int) -> pl.Series:
    return pl.select(pl.repeat(pl.lit(value, dtype=dtype), n)).to_series()


def _masked(values: pl.Series, keep: np.ndarray) -> pl.Series:
    """`values` where `keep`, else null."""
    return pl.select(pl.when(pl.Series(keep)).then(values)).to_series().alias(values.name)


def _concat(*parts: pl.Series | str) -> pl.Series:
    exprs = [
        pl.lit(p) if isinstance(p, str) else pl.lit(p).alias(f"p{i}") for i, p in enumerate(parts)
    ]
    return pl.select(pl.concat_str(exprs)).to_series()


def _text(values: np.ndarray) -> pl.Series:
    return pl.Series(values).cast(pl.String)


def _dates(year: np.ndarray, day: np.ndarray) -> pl.Series:
    return pl.Series((year - 1970).astype("datetime64[Y]").astype("datetime64[D]") + day)


def _json_lines(records: pl.DataFrame) -> pl.Series:
    return records.select(pl.struct(pl.all()).struct.json_encode()).to_series()
