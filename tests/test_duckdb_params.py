"""A statement with bound parameters costs no module search: DuckDB's Python client tries ``import
pandas`` for each parameter it binds, and without pandas installed that failed import walked
sys.path again every time (~0.2-0.5 ms a parameter: ~36 ms of a rare-phrase search, several ms of
every group commit). The database opener marks pandas absent, so the attempt fails at once."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from ingest.db import search, store, searchtokens as tokens

pytestmark = pytest.mark.skipif(importlib.util.find_spec("pandas") is not None, reason="pandas is installed: nothing searched")


class _Spy:
    """A meta-path finder that only counts who looks for what."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def find_spec(self, name, path=None, target=None):
        self.names.append(name)
        return None


@pytest.fixture
def spy():
    finder = _Spy()
    sys.meta_path.insert(0, finder)
    yield finder
    sys.meta_path.remove(finder)


def test_search_with_parameters_searches_no_module_when_pandas_is_absent(tmp_path, spy):
    con = store.open_database(tmp_path / "db.duckdb")
    try:
        con.execute("INSERT INTO logs VALUES ('C.1', 'setup', '0', 0, TIMESTAMP '2026-01-01', TIMESTAMP '2026-01-01', "
                    "'CUDA error: out of memory', false)")
        tokens.cover_unindexed(con)
        spy.names.clear()
        query = search.SearchQuery(text="out of memory", regex=False, since_us=0, until_us=2**62)
        hits, _, plan = search.search(con, 60, query)
        assert [h["instance_id"] for h in hits] == ["C.1"] and plan.filter == "trigrams"
        con.execute("SELECT count(*) FROM logs WHERE instance_id = $i AND seq >= $s", {"i": "C.1", "s": 0}).fetchall()
    finally:
        con.close()
    assert "pandas" not in spy.names


def test_pandas_still_imports_as_absent_after_the_database_opens(tmp_path):
    store.open_database(tmp_path / "db.duckdb").close()
    with pytest.raises(ImportError):
        import pandas  # noqa: F401
