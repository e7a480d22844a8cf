"""Lake mode's instance tokens (ingest/auth.py SharedTokens): looked up in PostgreSQL on a miss,
dropped when PostgreSQL shows a re-issue, and a 503 (never a 401) while PostgreSQL cannot answer."""

from __future__ import annotations

import asyncio
import time
import uuid

import psycopg
import pytest

from ingest.auth import TokenBook, digest
from ingest.db.lake.tokens import SharedTokens
from ingest.errors import Overloaded, Unauthorized
from tests.conftest import free_port
from tests.lake_pg import postgres  # noqa: F401 (a fixture)

ADMIN = "admin-s1"
FIRST, SECOND = "fli_" + "a" * 43, "fli_" + "b" * 43  # the shape TokenBook.new_token gives


def bearer(token: str) -> str:
    return f"Bearer {token}"


async def test_an_unknown_token_while_postgres_is_unreachable_is_503_not_401():
    book = TokenBook("enroll", "read", ADMIN)
    book.shared = SharedTokens(book, f"host=127.0.0.1 port={free_port()} user=nobody dbname=none connect_timeout=2",
                               lookup_timeout_s=3, retry_after_s=2)
    try:
        with pytest.raises(Overloaded) as refused:  # an agent retries a 503; it would give up on a 401
            await book.authenticate(bearer(TokenBook.new_token()[0]))
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
        conn.execute("INSERT INTO instance_tokens VALUES ('C.1', %s, now() AT TIME ZONE 'UTC')", [digest(FIRST)])
    book = TokenBook("enroll", "read", ADMIN)
    book.shared = SharedTokens(book, dsn, poll_s=3600)  # polled by hand below
    await book.shared.start()
    try:
        assert (await book.authenticate(bearer(FIRST))).instance_id == "C.1"  # issued elsewhere: looked up
        assert book.identify(bearer(FIRST)).instance_id == "C.1"  # and cached
        with pytest.raises(Unauthorized):
            await book.authenticate(bearer(TokenBook.new_token()[0]))
        with psycopg.connect(dsn, autocommit=True) as conn:  # another node re-issues: one transaction
            with conn.transaction():
                conn.execute("DELETE FROM instance_tokens WHERE instance_id = 'C.1'")
                conn.execute("INSERT INTO instance_tokens VALUES ('C.1', %s, now() AT TIME ZONE 'UTC')", [digest(SECOND)])
        assert book.identify(bearer(FIRST)).instance_id == "C.1"  # still cached until the poll
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await book.shared.poll(conn)
        with pytest.raises(Unauthorized):
            await book.authenticate(bearer(FIRST))
        assert (await book.authenticate(bearer(SECOND))).instance_id == "C.1"
    finally:
        await book.shared.close()


def _token_table(postgres) -> str:  # noqa: F811
    dsn = postgres.createdb("t" + uuid.uuid4().hex[:12]).removeprefix("postgres:")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE instance_tokens (instance_id text NOT NULL, token_sha256 text NOT NULL, "
                     "issued_at timestamp NOT NULL)")
    return dsn


def _issue_elsewhere(dsn: str, instance_id: str) -> str:
    token, token_sha = TokenBook.new_token()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO instance_tokens VALUES (%s, %s, now() AT TIME ZONE 'UTC')", [instance_id, token_sha])
    return token


class SlowLink:
    """A TCP proxy in front of PostgreSQL adding ``delay_s`` each way (a database a few milliseconds
    away, as across availability zones)."""

    def __init__(self, port: int, delay_s: float) -> None:
        self.target, self.delay_s, self.port = port, delay_s, free_port()
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task] = set()

    async def __aenter__(self) -> "SlowLink":
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.server.wait_closed()

    async def _serve(self, reader, writer) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(src, dst))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _pipe(self, src, dst) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        async def send() -> None:
            while (item := await queue.get()) is not None:
                await asyncio.sleep(max(0.0, item[0] - loop.time()))
                dst.write(item[1])
                await dst.drain()

        sender = asyncio.create_task(send())
        try:
            while data := await src.read(65536):
                queue.put_nowait((loop.time() + self.delay_s, data))
            queue.put_nowait(None)
            await sender
        except ConnectionError:
            pass
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
            dst.close()


@pytest.mark.lake
async def test_a_flood_of_made_up_tokens_does_not_keep_a_token_issued_elsewhere_out(postgres):  # noqa: F811
    """An attacker with no token opens many connections, each presenting a fresh, well-formed token
    never issued. Every one is a miss; a token another node has just issued must still work within
    a few seconds (an agent retries a 503 after its Retry-After), and PostgreSQL sees a bounded number
    of lookups at a time."""
    dsn = _token_table(postgres)
    async with SlowLink(postgres.port, 0.002) as link:
        await _flood(dsn, dsn.replace(f"port={postgres.port}", f"port={link.port}"))


async def _flood(dsn: str, slow_dsn: str) -> None:
    book = TokenBook("enroll", "read", ADMIN)
    book.shared = SharedTokens(book, slow_dsn, poll_s=0.5, retry_after_s=1)
    await book.shared.start()
    stop = asyncio.Event()
    attempts = [0]

    async def attacker() -> None:
        while not stop.is_set():
            attempts[0] += 1
            try:
                await book.authenticate(bearer(TokenBook.new_token()[0]))
            except Unauthorized:
                pass
            except Overloaded:
                await asyncio.sleep(0.01)  # a new connection, a new request

    flood = [asyncio.create_task(attacker()) for _ in range(1500)]
    try:
        flood_deadline = time.monotonic() + 120
        while attempts[0] < 3000:  # the flood is on
            assert time.monotonic() < flood_deadline, attempts
            await asyncio.sleep(0.05)
        token = _issue_elsewhere(dsn, "C.new")
        issued = time.monotonic()
        while True:  # as the agent: a 503 is retried, a 401 is final
            try:
                principal = await book.authenticate(bearer(token))
                break
            except Overloaded:
                assert time.monotonic() - issued < 8, "a genuine token kept out by the flood"
                await asyncio.sleep(0.2)
        assert principal.instance_id == "C.new"
        assert time.monotonic() - issued < 8
        assert book.shared.most_in_flight <= book.shared.max_lookups_in_flight
    finally:
        stop.set()
        await asyncio.gather(*flood)
        await book.shared.close()


@pytest.mark.lake
async def test_a_token_presented_again_and_again_is_looked_up_once_and_garbage_never(postgres):  # noqa: F811
    dsn = _token_table(postgres)
    book = TokenBook("enroll", "read", ADMIN)
    book.shared = SharedTokens(book, dsn, poll_s=3600)
    await book.shared.start()
    try:
        for garbage in ("not-a-token", "fli_short", "x" * 4000):
            with pytest.raises(Unauthorized):
                await book.authenticate(bearer(garbage))
        assert book.shared.queries == 0
        made_up = TokenBook.new_token()[0]
        outcomes = await asyncio.gather(*(book.authenticate(bearer(made_up)) for _ in range(200)), return_exceptions=True)
        assert all(isinstance(o, Unauthorized) for o in outcomes), {type(o).__name__ for o in outcomes}
        assert book.shared.queries == 1  # the others waited for it, or met the remembered miss
    finally:
        await book.shared.close()


@pytest.mark.lake
async def test_the_poll_brings_tokens_issued_elsewhere_and_a_reissue_here_is_not_undone(postgres):  # noqa: F811
    dsn = _token_table(postgres)
    book = TokenBook("enroll", "read", ADMIN)
    book.shared = SharedTokens(book, dsn, poll_s=3600)  # polled by hand below
    await book.shared.start()
    try:
        token = _issue_elsewhere(dsn, "C.1")
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await book.shared.poll(conn)
            assert book.identify(bearer(token)).instance_id == "C.1"  # no lookup needed
            assert book.shared.queries == 0
            # a poll whose rows were read before this node re-issued C.1's token must not bring the old one back
            started = time.monotonic()
            book.replace("C.1", digest("re-issued here"))
            book.shared.take_rows([("C.1", digest(token))], started)
        with pytest.raises(Unauthorized):
            book.identify(bearer(token))
    finally:
        await book.shared.close()


@pytest.mark.lake
async def test_the_memory_of_misses_is_bounded_and_keeps_the_newest(postgres):  # noqa: F811
    """A flood of fresh made-up tokens fills the memory of misses: it stays within its bound by
    forgetting the oldest, and goes on remembering the newest (those a client repeats)."""
    dsn = _token_table(postgres)
    book = TokenBook("enroll", "read", ADMIN)
    book.shared = SharedTokens(book, dsn, poll_s=3600, miss_ttl_s=60)
    book.shared.MAX_MISSES = 4
    await book.shared.start()
    try:
        made_up = [TokenBook.new_token()[0] for _ in range(10)]
        for token in made_up:
            with pytest.raises(Unauthorized):
                await book.authenticate(bearer(token))
        assert book.shared.queries == 10
        for token in made_up[-4:]:  # remembered: no query
            with pytest.raises(Unauthorized):
                await book.authenticate(bearer(token))
        assert book.shared.queries == 10
        with pytest.raises(Unauthorized):  # forgotten: asked again
            await book.authenticate(bearer(made_up[0]))
        assert book.shared.queries == 11
    finally:
        await book.shared.close()
