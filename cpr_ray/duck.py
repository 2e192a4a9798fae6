"""DuckDB over Arrow batches: the engine that does per-block work inside Ray tasks.

Ray moves blocks; inside a block we want a vectorised engine, not a Python loop over rows. One
in-process connection per call is cheap (milliseconds) and keeps tasks independent.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa

# Shared normalisations, so S2 and OpenAlex keys are normalised by the very same expression.
MACROS = r"""
CREATE OR REPLACE MACRO norm_doi(x) AS
    nullif(regexp_replace(lower(trim(x)), '^(https?://(dx\.)?doi\.org/|doi:\s*)', ''), '');
CREATE OR REPLACE MACRO trailing_int(x) AS
    TRY_CAST(nullif(regexp_extract(CAST(x AS VARCHAR), '(\d+)\s*$', 1), '') AS BIGINT);
"""


def query(sql: str, threads: int = 1, **tables: pa.Table) -> pa.Table:
    """Run `sql` over the given Arrow tables (referenced by keyword name) and return Arrow."""
    con = duckdb.connect(config={"threads": max(1, threads)})
    try:
        con.execute(MACROS)
        for name, table in tables.items():
            con.register(name, table)
        return con.sql(sql).to_arrow_table()
    finally:
        con.close()
