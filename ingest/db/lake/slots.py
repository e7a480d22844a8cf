"""Which node of a lake owns which instance: hash slots leased in PostgreSQL, with fencing tokens.

An instance belongs to slot ``crc32(instance_id) % SLOTS``; a slot is owned by at most one node at
a time through a row of ``fleetlog_slots`` (owner, url, token, expires_at). Each node's lease
thread, on its own PostgreSQL connection, every ``lease_s / 3``:

1. heartbeats its row in ``fleetlog_nodes``;
2. renews the leases it holds (a lease it finds taken is dropped at once);
3. claims expired or free slots up to its fair share (SLOTS / live nodes, rounded up), bumping each
   slot's token, and gives back what it holds beyond the share plus one (by letting it expire:
   it stops accepting pushes for it at once and stops renewing it);
4. before a claimed slot is served, ``on_acquire`` loads its instances' seq ranges from the lake
   (the previous owner's commits are all visible by then: its lease had expired).

Fencing: every commit checks, inside its own transaction, that each instance it writes is in a
slot this node holds with the token it was granted and at least ``lease_s / 2`` left
(``fence_sql``); a takeover needs the lease expired, so a commit that passed the check has that
margin to finish before any other node may serve the slot. The margin, not the token, is what keeps
a paused node out (DuckLake offers no conditional commit); docs/scale-out.md says so.

Retention deletes an instance's lines on the node running the policies; every pass also hands the
instances retired since (``delete_logs`` decisions executed) to ``on_retired``, so the other nodes
drop them from their tail cache and seq index too.

The policy runner is one node at a time too: ``try_policy_lock`` takes a PostgreSQL session advisory
lock on this thread's connection, held until the node stops or loses the connection.
"""

from __future__ import annotations

import logging
import math
import threading
import zlib
from typing import Callable, Iterable

import psycopg

logger = logging.getLogger(__name__)

SLOTS = 64
POLICY_LOCK_KEY = 0x666C6F67  # "flog"

DDL = f"""
CREATE TABLE IF NOT EXISTS fleetlog_nodes (node_id text PRIMARY KEY, url text NOT NULL, heartbeat_at timestamptz NOT NULL);
CREATE TABLE IF NOT EXISTS fleetlog_slots (
    slot integer PRIMARY KEY, owner text, url text, token bigint NOT NULL DEFAULT 0, expires_at timestamptz);
INSERT INTO fleetlog_slots (slot) SELECT generate_series(0, {SLOTS - 1}) ON CONFLICT DO NOTHING;
-- one row per maintenance pass of the lake (ingest/db/lake/jobs.py)
CREATE TABLE IF NOT EXISTS fleetlog_maintenance (
    node_id text NOT NULL, started_at timestamptz NOT NULL, finished_at timestamptz,
    files_before integer, files_after integer, error text);
"""


def slot_of(instance_id: str) -> int:
    return zlib.crc32(instance_id.encode()) % SLOTS


class NotOwner(Exception):
    """This node does not (or no longer) hold the slot of an instance it was asked to write."""


class Slots:
    def __init__(self, dsn: str, node_id: str, url: str, lease_s: float,
                 on_acquire: Callable[[set[int]], None] | None = None,
                 on_retired: Callable[[set[str]], None] | None = None) -> None:
        self.dsn, self.node_id, self.url, self.lease_s = dsn, node_id, url, lease_s
        self.on_acquire = on_acquire
        self.on_retired = on_retired  # instances whose logs retention deleted (on another node)
        self._retired_seen: set[int] = set()  # delete_logs decisions already handed to on_retired
        self._lock = threading.Lock()
        self._held: dict[int, int] = {}  # slot -> token, served
        self._owners: dict[int, tuple[str, str, bool]] = {}  # slot -> (owner, url, live), as last read
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection | None = None
        self._policy_locked = False
        self.ready = threading.Event()  # set after the first pass

    # -- reading the map (any thread) --------------------------------------------------------------

    def token(self, slot: int) -> int | None:
        with self._lock:
            return self._held.get(slot)

    def route(self, instance_id: str) -> tuple[str, str | None]:
        """("self", None), ("node", url) of the live owner, or ("wait", None) while nobody serves it."""
        slot = slot_of(instance_id)
        with self._lock:
            if slot in self._held:
                return "self", None
            owner = self._owners.get(slot)
        if owner is None or not owner[2] or owner[0] == self.node_id:
            return "wait", None
        return "node", owner[1]

    def held(self) -> dict[int, int]:
        with self._lock:
            return dict(self._held)

    def fence_sql(self, instance_ids: Iterable[str]) -> str | None:
        """A PostgreSQL query counting the slots of ``instance_ids`` still held with this node's tokens
        and the margin left; None (refuse) when a slot is not held here at all."""
        needed = {slot_of(i) for i in instance_ids}
        with self._lock:
            if not needed <= self._held.keys():
                return None
            pairs = ", ".join(f"({s}, {self._held[s]})" for s in sorted(needed))
        node = self.node_id.replace("'", "''")
        margin = self.lease_s / 2
        return (f"SELECT count(*) AS n, {len(needed)} AS want FROM fleetlog_slots s JOIN (VALUES {pairs}) AS v(slot, token) "
                f"ON s.slot = v.slot AND s.token = v.token WHERE s.owner = '{node}' "
                f"AND s.expires_at > now() + interval '{margin} seconds'")

    # -- the lease thread ---------------------------------------------------------------------------

    def start(self) -> None:
        self._conn = psycopg.connect(self.dsn, autocommit=True)
        self._conn.execute(f"SELECT pg_advisory_lock({POLICY_LOCK_KEY + 1})")  # one DDL at a time
        try:
            self._conn.execute(DDL)
        finally:
            self._conn.execute(f"SELECT pg_advisory_unlock({POLICY_LOCK_KEY + 1})")
        self._heartbeat()
        self._thread = threading.Thread(target=self._run, name="fleetlog-slots", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        if self._conn is not None:
            try:  # hand the slots back at once: the next owner need not wait for expiry
                self._conn.execute("UPDATE fleetlog_slots SET expires_at = now() - interval '1 second' WHERE owner = %s",
                                   [self.node_id])
                self._conn.execute("DELETE FROM fleetlog_nodes WHERE node_id = %s", [self.node_id])
            except psycopg.Error:
                pass
            self._conn.close()

    def _run(self) -> None:
        settle = True  # the first pass only heartbeats, so nodes started together see each other
        while not self._stop.is_set():
            try:
                self.step(claim=not settle)
                settle = False
            except Exception:
                logger.exception("slot lease pass failed; retrying")
                self._reconnect()
            self._stop.wait(self.lease_s / 3)

    def _reconnect(self) -> None:
        with self._lock:
            self._held.clear()  # without PostgreSQL, nothing is provably ours
        try:
            if self._conn is not None:
                self._conn.close()
            self._conn = psycopg.connect(self.dsn, autocommit=True)
            self._policy_locked = False
        except psycopg.Error:
            logger.warning("PostgreSQL unreachable for slot leases")

    def _heartbeat(self) -> None:
        self._conn.execute(
            """INSERT INTO fleetlog_nodes VALUES (%s, %s, now())
               ON CONFLICT (node_id) DO UPDATE SET url = excluded.url, heartbeat_at = now()""",
            [self.node_id, self.url])

    def step(self, claim: bool = True) -> None:
        conn, lease = self._conn, f"{self.lease_s} seconds"
        self._heartbeat()
        renewed = dict(conn.execute(
            "UPDATE fleetlog_slots SET expires_at = now() + %s::interval WHERE owner = %s AND slot = ANY(%s) "
            "AND expires_at > now() RETURNING slot, token",
            [lease, self.node_id, list(self.held())]).fetchall())
        with self._lock:
            lost = set(self._held) - set(renewed)
            self._held = {s: t for s, t in self._held.items() if renewed.get(s) == t}
        if lost:
            logger.warning("lost slots %s", sorted(lost))
        live = conn.execute("SELECT count(*) FROM fleetlog_nodes WHERE heartbeat_at > now() - %s::interval",
                            [lease]).fetchone()[0]
        share = math.ceil(SLOTS / max(live, 1))
        held = self.held()
        if claim and len(held) < share:
            claimed = dict(conn.execute(
                """UPDATE fleetlog_slots SET owner = %s, url = %s, token = token + 1, expires_at = now() + %s::interval
                   WHERE slot IN (SELECT slot FROM fleetlog_slots WHERE owner IS NULL OR expires_at < now()
                                  ORDER BY slot LIMIT %s FOR UPDATE SKIP LOCKED)
                   RETURNING slot, token""",
                [self.node_id, self.url, lease, share - len(held)]).fetchall())
            if claimed:
                if self.on_acquire is not None:
                    self.on_acquire(set(claimed))  # seq ranges first, then serve
                with self._lock:
                    self._held.update(claimed)
                logger.info("node %s took slots %s", self.node_id, sorted(claimed))
        elif len(held) > share + 1:
            extra = sorted(held)[share:]
            with self._lock:
                for slot in extra:
                    self._held.pop(slot, None)
            conn.execute("UPDATE fleetlog_slots SET expires_at = now() + %s::interval WHERE owner = %s AND slot = ANY(%s)",
                         [f"{self.lease_s / 2 + 0.5} seconds", self.node_id, extra])  # past any fenced commit's margin
            logger.info("node %s gives back slots %s", self.node_id, extra)
        rows = conn.execute("SELECT slot, owner, url, coalesce(expires_at > now(), false) FROM fleetlog_slots").fetchall()
        with self._lock:
            self._owners = {slot: (owner, url, live) for slot, owner, url, live in rows}
        if self.on_retired is not None:
            self._learn_retired(conn)
        self.ready.set()

    def _learn_retired(self, conn: psycopg.Connection) -> None:
        """Retention runs on the policy node, which forgets the instance at once; every other node
        learns it here, from the decisions executed in the last hour, each once."""
        rows = dict(conn.execute(
            "SELECT id, subject FROM decisions WHERE action = 'delete_logs' AND state = 'executed' "
            "AND executed_at > (now() AT TIME ZONE 'UTC') - interval '1 hour'").fetchall())
        new = {subject for decision, subject in rows.items() if decision not in self._retired_seen}
        if new:
            try:
                self.on_retired(new)
            except Exception:  # never let it cost the leases: the next pass tries again
                logger.exception("forgetting retired instances %s failed", sorted(new))
                return
        self._retired_seen = set(rows)

    def try_policy_lock(self) -> bool:
        """Whether this node runs the policies (a session advisory lock, kept once taken)."""
        if not self._policy_locked and self._conn is not None:
            try:
                self._policy_locked = self._conn.execute("SELECT pg_try_advisory_lock(%s)", [POLICY_LOCK_KEY]).fetchone()[0]
            except psycopg.Error:
                return False
        return self._policy_locked
