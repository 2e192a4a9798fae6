"""`duck.query`: each call sees the tables it was given and no other call's, on any thread, while
calls share one database per process (the macros, created once)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import duckdb
import pyarrow as pa
import pytest

from cpr_ray.tables import duckdb_sql as duck


def test_calls_on_many_threads_see_only_their_own_tables():
    def total(v: int) -> list[int]:
        return [
            duck.query("SELECT sum(a) AS s FROM t", t=pa.table({"a": [v] * 3}))["s"][0].as_py()
            for _ in range(20)
        ]

    with ThreadPoolExecutor(4) as pool:
        sums = list(pool.map(total, range(1, 9)))
    assert sums == [[3 * v] * 20 for v in range(1, 9)]


def test_a_table_is_gone_after_its_call_and_the_macros_stay():
    assert duck.query("SELECT count(*) AS n FROM gone", gone=pa.table({"a": [1]}))[
        "n"
    ].to_pylist() == [1]
    with pytest.raises(duckdb.CatalogException):
        duck.query("SELECT * FROM gone")
    for threads in (1, 2):
        doi = duck.query("SELECT norm_doi(' https://doi.org/10.1/AB ') AS d", threads=threads)
        assert doi["d"].to_pylist() == ["10.1/ab"]
