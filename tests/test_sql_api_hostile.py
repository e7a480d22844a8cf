"""The SQL API cannot change anything and cannot read secrets or files: a hostile corpus.

One real server (a subprocess, tokens on) for the module; the attacker holds the read token. Each
attempt goes through json, csv and arrow and must be refused with a 400 naming why; after each,
nothing changed: every table's row count, the dedupe index (an existing seq is still a duplicate, a
new one still accepted), the tail cache (the tail still ends with the newest line), and no forged
token works. At the end the database file itself is checked, secret table included.
"""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request

import pytest

from tests.conftest import ServerProcess, read_db

ADMIN, READ, ENROLL = "adm-" + "a" * 20, "rd-" + "r" * 20, "enr-" + "e" * 20
FORGED = "fli_forged_token_for_the_corpus"
FORGED_SHA = hashlib.sha256(FORGED.encode()).hexdigest()
TABLES = ["logs", "events", "instances", "metrics", "bench_runs", "decisions", "host_verdicts", "schema_migrations"]
COUNTS_SQL = "SELECT " + ", ".join(f"(SELECT count(*) FROM {t})" for t in TABLES)

WRITES = [
    "DELETE FROM logs RETURNING *",
    "DELETE FROM instances RETURNING instance_id",
    "DELETE FROM schema_migrations RETURNING version",
    f"INSERT INTO instance_tokens VALUES ('C.1', '{FORGED_SHA}', now()) RETURNING *",
    "INSERT INTO decisions (rule, rule_sha, subject, action, reason, evidence, episode, decided_at, state) "
    "VALUES ('x', 'x', 'C.1', 'destroy', 'forged', '{}', 'e', now(), 'proposed') RETURNING id",
    "UPDATE logs SET line = 'overwritten' RETURNING seq",
    "UPDATE decisions SET state = 'proposed' RETURNING id",
    "INSERT INTO logs SELECT * FROM logs RETURNING seq",
]
NESTINGS = [
    "WITH x AS ({w}) SELECT count(*) FROM x",
    "WITH x AS MATERIALIZED ({w}) SELECT count(*) FROM x",
    "WITH x AS NOT MATERIALIZED ({w}) SELECT 1",
    "SELECT * FROM (WITH x AS ({w}) SELECT count(*) FROM x) s",
    "SELECT (WITH x AS ({w}) SELECT count(*) FROM x)",
    "SELECT 1 UNION ALL (WITH x AS ({w}) SELECT count(*) FROM x)",
    "(WITH x AS ({w}) SELECT count(*) FROM x) UNION SELECT 1",
    "SELECT * FROM range(1) r, LATERAL (WITH x AS ({w}) SELECT count(*) FROM x) l",
    "WITH a AS (WITH x AS ({w}) SELECT * FROM x) SELECT count(*) FROM a",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 2), x AS ({w}) SELECT count(*) FROM r, x",
    "SELECT EXISTS (WITH x AS ({w}) SELECT 1 FROM x)",
    "SELECT 1 WHERE 1 IN (WITH x AS ({w}) SELECT 1 FROM x)",
    "SELECT * FROM logs WHERE seq > (WITH x AS ({w}) SELECT count(*) FROM x)",
    "SELECT list(v) FROM (WITH x AS ({w}) SELECT 1 AS v FROM x)",
    "FROM (WITH x AS ({w}) SELECT count(*) FROM x)",
    "SELECT * FROM (SELECT 1) a JOIN (WITH x AS ({w}) SELECT count(*) AS c FROM x) b ON true",
]
STATEMENTS = [
    "DELETE FROM logs", "INSERT INTO logs SELECT * FROM logs", "UPDATE decisions SET state = 'proposed'",
    f"INSERT INTO instance_tokens VALUES ('C.1', '{FORGED_SHA}', now())", "DELETE FROM schema_migrations",
    "COPY logs TO 'stolen.csv'", "COPY (SELECT * FROM instance_tokens) TO 'x.csv'", "COPY logs FROM 'x.csv'",
    "ATTACH 'other.duckdb' AS other", "ATTACH ':memory:' AS m", "DETACH fleetlog", "USE memory",
    "SET enable_external_access = true", "SET memory_limit = '64GB'", "RESET lock_configuration",
    "PRAGMA enable_profiling", "PRAGMA database_size", "CALL checkpoint()", "CHECKPOINT", "FORCE CHECKPOINT",
    "EXPORT DATABASE 'dump'", "IMPORT DATABASE 'dump'", "INSTALL httpfs", "LOAD httpfs", "VACUUM",
    "DROP TABLE logs", "CREATE TABLE x AS SELECT 1", "CREATE MACRO m() AS 1", "ALTER TABLE logs RENAME TO l",
    "BEGIN", "COMMIT", "ROLLBACK", "PREPARE p AS DELETE FROM logs", "EXECUTE p", "SELECT 1; DELETE FROM logs",
    "DELETE FROM logs; SELECT 1", "CREATE SECRET s (TYPE s3)", "TRUNCATE logs", "UPDATE instances SET dph = 0",
    "INSERT OR REPLACE INTO instances (instance_id) VALUES ('C.1')", "PIVOT logs ON source",
    "EXPLAIN ANALYZE DELETE FROM logs", "SUMMARIZE instance_tokens", "DESCRIBE instance_tokens", "SHOW TABLES",
    "SHOW instance_tokens", "SHOW ALL TABLES",
]
FILE_FUNCTIONS = [
    "read_blob('{f}')", "read_text('{f}')", "read_csv('{f}')", "read_csv_auto('{f}')", "read_parquet('{f}')",
    "parquet_scan('{f}')", "read_json('{f}')", "read_json_auto('{f}')", "read_ndjson('{f}')", "glob('{f}')",
    "sniff_csv('{f}')", "parquet_metadata('{f}')", "query('SELECT * FROM read_blob(''{f}'')')",
]
SECRETS = [
    "SELECT * FROM instance_tokens", 'SELECT * FROM "instance_tokens"', "SELECT * FROM main.instance_tokens",
    'SELECT * FROM "main"."instance_tokens"', "SELECT * FROM {catalog}.main.instance_tokens",
    'SELECT * FROM "{catalog}"."main"."instance_tokens"', "SELECT * FROM INSTANCE_TOKENS",
    'SELECT * FROM "Instance_Tokens"', "SELECT * FROM query_table('instance_tokens')",
    "SELECT * FROM query_table(['instance_tokens'])", "SELECT * FROM query('SELECT * FROM instance_tokens')",
    "SELECT (SELECT max(token_sha256) FROM instance_tokens)", "SELECT * FROM logs, instance_tokens",
    "WITH instance_tokens AS (SELECT * FROM instance_tokens) SELECT * FROM instance_tokens",
    "WITH t AS (SELECT 1) SELECT * FROM t, (SELECT * FROM instance_tokens)",
    "SELECT EXISTS (SELECT 1 FROM instance_tokens WHERE token_sha256 LIKE 'a%')",
    "SELECT * FROM logs WHERE line IN (SELECT token_sha256 FROM instance_tokens)",
    "SELECT * FROM (FROM instance_tokens)", "SELECT * FROM duckdb_tables()", "SELECT * FROM duckdb_secrets()",
    "SELECT * FROM duckdb_settings()", "SELECT * FROM duckdb_databases()", "SELECT * FROM sqlite_master",
    "SELECT * FROM information_schema.tables", "SELECT * FROM temp.main.x", "SELECT * FROM system.main.duckdb_tables",
    "SELECT * FROM pg_catalog.pg_tables", "SELECT * FROM other.logs", "SELECT * FROM memory.main.logs",
    "SELECT * FROM instance_tokens AT (VERSION => 1)", "SELECT * FROM 'instance_tokens'",
    "SELECT * FROM checkpoint()", "SELECT * FROM force_checkpoint()", "SELECT * FROM pragma_database_size()",
    "SELECT * FROM duckdb_temporary_files()", "SELECT * FROM which_secret('s3://x', 's3')",
]
SIDE_EFFECTS = [
    "SELECT nextval('decision_ids')", "SELECT setval('decision_ids', 1)", "SELECT currval('decision_ids')",
    "SELECT write_log('x')", "SELECT setseed(0.5)", "SELECT sleep_ms(100000)",
    "SELECT * FROM logs WHERE seq = nextval('decision_ids')", "SELECT (SELECT nextval('decision_ids'))",
]


def _corpus() -> list[str]:
    out = [n.format(w=w) for w in WRITES for n in NESTINGS]
    out += STATEMENTS + SECRETS + SIDE_EFFECTS
    files = ["{db}", "{db}.wal", "{db}.tmp", "{db}.tmp/*", "/etc/passwd", "{dir}/*"]
    out += [f"SELECT * FROM {fn.replace('{f}', f)}" for fn in FILE_FUNCTIONS for f in files]
    out += [f"SELECT * FROM '{f}'" for f in files]
    out += [f"SELECT (SELECT count(*) FROM {fn.replace('{f}', f)})" for fn in FILE_FUNCTIONS[:3] for f in files[:2]]
    return out


CORPUS = _corpus()


class Fleet:
    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.seq = 3  # seqs 0..2 pushed at start
        self.counts: list[int] | None = None

    def call(self, method: str, path: str, body=None, token: str = READ) -> tuple[int, dict, bytes]:
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        request = urllib.request.Request(self.server.url + path, data=data, method=method,
                                         headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def push(self, seqs: list[int]) -> dict:
        doc = {"instance_id": "C.1", "source": "benchout",
               "lines": [{"seq": s, "ts": 1795951000 + s, "line": f"line {s}"} for s in seqs]}
        status, _, body = self.call("POST", "/api/v1/logs", doc, ADMIN)
        assert status == 200, body
        return json.loads(body)

    def sql(self, sql: str, fmt: str = "json") -> tuple[int, bytes]:
        status, _, body = self.call("POST", f"/api/v1/query?format={fmt}", {"sql": sql})
        return status, body

    def table_counts(self) -> list[int]:
        status, body = self.sql(COUNTS_SQL)
        assert status == 200, body
        return json.loads(body)["rows"][0]

    def assert_unchanged(self) -> None:
        assert self.table_counts() == self.counts
        assert self.push([0, self.seq]) == {"ok": True, "accepted": 1, "duplicates": 1}  # dedupe index intact
        self.counts[0] += 1
        status, _, body = self.call("GET", "/api/v1/instances/C.1/logs?source=benchout&tail=2")
        assert status == 200
        assert [line["seq"] for line in json.loads(body)["lines"]] == [self.seq - 1, self.seq]  # tail cache intact
        self.seq += 1
        assert self.call("GET", "/api/v1/instances", token=FORGED)[0] == 401


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    server = ServerProcess(tmp / "fleetlog.duckdb", tmp / "server.log", "--admin-token", ADMIN, "--read-token", READ,
                           "--enroll-token", ENROLL, "--policy-interval-s", "0")
    server.start()
    try:
        f = Fleet(server)
        status, _, body = f.call("POST", "/api/v1/events", {"instance_id": "C.1", "kind": "registered", "ts": 1795951000,
                                                            "machine_id": 7}, ENROLL)
        assert status == 200 and "C.1" in json.loads(body)["tokens"], body
        f.push([0, 1, 2])
        f.counts = f.table_counts()
        yield f
    finally:
        server.stop()
    counts = read_db(str(tmp / "fleetlog.duckdb"), COUNTS_SQL)[0]
    assert list(counts) == f.counts
    assert read_db(str(tmp / "fleetlog.duckdb"), "SELECT count(*) FROM instance_tokens WHERE token_sha256 = ?",
                   [FORGED_SHA]) == [(0,)]
    assert read_db(str(tmp / "fleetlog.duckdb"), "SELECT count(*) FROM instance_tokens") == [(1,)]


def test_corpus_is_hundreds_of_attempts():
    assert len(CORPUS) >= 300, len(CORPUS)


@pytest.mark.parametrize("sql", CORPUS, ids=[f"{i:03d}" for i in range(len(CORPUS))])
def test_hostile_sql_is_refused_and_changes_nothing(fleet, sql):
    db = fleet.server.db
    sql = sql.replace("{db}", str(db)).replace("{dir}", str(db.parent)).replace("{catalog}", db.stem)
    for fmt in ("json", "csv", "arrow"):
        status, body = fleet.sql(sql, fmt)
        assert status == 400, (fmt, status, body[:300])
        error = json.loads(body)["error"]
        assert error.startswith("sql: ") and len(error) > 10, error
        assert b"DUCK" not in body and FORGED_SHA.encode() not in body
    fleet.assert_unchanged()


@pytest.mark.parametrize("sql, expected", [
    ("SELECT count(*) FROM logs WHERE instance_id = 'C.1'", None),
    ("WITH x AS (SELECT seq FROM logs) SELECT count(*) FROM x", None),
    ("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT sum(n) FROM r", [[6]]),
    ("SELECT sum(i) FROM range(4) t(i)", [[6]]),
    ("SELECT count(*) FROM {catalog}.main.logs WHERE seq < 0", [[0]]),
    ("SELECT unnest([1, 2]) ORDER BY 1", [[1], [2]]),
    ("SELECT count(*) FROM (SELECT random()) t", [[1]]),
    ("DESCRIBE logs", None),
])
def test_plain_selects_still_answer(fleet, sql, expected):
    status, body = fleet.sql(sql.replace("{catalog}", fleet.server.db.stem))
    assert status == 200, body
    if expected is not None:
        assert json.loads(body)["rows"] == expected
    fleet.assert_unchanged()
