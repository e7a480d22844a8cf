"""Lake mode's instance tokens (ingest/auth.py SharedTokens): looked up in PostgreSQL on a miss,
dropped when PostgreSQL shows a re-issue, and a 503 (never a 401) while PostgreSQL cannot answer."""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest

from ingest.auth import SharedTokens, TokenBook, digest
from ingest.errors import Overloaded, Unauthorized
from tests.conftest import free_port
from tests.lake_pg import postgres  # noqa: F401 (a fixture)

ADMIN = "admin-s1"


def bearer(token: str) -> str:
    return f"Bearer {token}"


async def test_an_unknown_token_while_postgres_is_unreachable_is_503_not_401():
    book = TokenBook("enroll", "read", ADMIN)
    book.shared = SharedTokens(book, f"host=127.0.0.1 port={free_port()} user=nobody dbname=none connect_timeout=2",
                               lookup_timeout_s=3, retry_after_s=2)
    try:
        with pytest.raises(Overloaded) as refused:  # an agent retries a 503; it would give up on a 401
            await book.authenticate(bearer("fli_issued_by_another_node"))
        assert refused.value.headers == {"Retry-After": "2"}
        assert (await book.authenticate(bearer(ADMIN))).kind == "admin"  # fleet tokens need no PostgreSQL
        with pytest.raises(Unauthorized):
            await book.authenticate(None)
    finally:
        await book.shared.close()


def test_a_lookup_answered_before_a_drop_is_not_cached():
    book = TokenBook("enroll", "read", ADMIN)
    asked_at = time.monotonic()
    book.drop_others("C.1", digest("second"))  # the poll saw a re-issue while the lookup was in flight
    book.remember_looked_up("C.1", digest("first"), asked_at)
    with pytest.raises(Unauthorized):
        book.identify(bearer("first"))
    book.remember_looked_up("C.1", digest("second"), time.monotonic())
    assert book.identify(bearer("second")).instance_id == "C.1"


@pytest.mark.lake
async def test_tokens_follow_postgres_issue_and_reissue(postgres):  # noqa: F811
    dsn = postgres.createdb("t" + uuid.uuid4().hex[:12]).removeprefix("postgres:")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE instance_tokens (instance_id text NOT NULL, token_sha256 text NOT NULL, "
                     "issued_at timestamp NOT NULL)")
        conn.execute("INSERT INTO instance_tokens VALUES ('C.1', %s, now() AT TIME ZONE 'UTC')", [digest("first")])
    book = TokenBook("enroll", "read", ADMIN)
    book.shared = SharedTokens(book, dsn, poll_s=3600)  # polled by hand below
    await book.shared.start()
    try:
        assert (await book.authenticate(bearer("first"))).instance_id == "C.1"  # issued elsewhere: looked up
        assert book.identify(bearer("first")).instance_id == "C.1"  # and cached
        with pytest.raises(Unauthorized):
            await book.authenticate(bearer("never issued"))
        with psycopg.connect(dsn, autocommit=True) as conn:  # another node re-issues: one transaction
            with conn.transaction():
                conn.execute("DELETE FROM instance_tokens WHERE instance_id = 'C.1'")
                conn.execute("INSERT INTO instance_tokens VALUES ('C.1', %s, now() AT TIME ZONE 'UTC')", [digest("second")])
        assert book.identify(bearer("first")).instance_id == "C.1"  # still cached until the poll
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await book.shared.poll(conn)
        with pytest.raises(Unauthorized):
            await book.authenticate(bearer("first"))
        assert (await book.authenticate(bearer("second"))).instance_id == "C.1"
    finally:
        await book.shared.close()
