"""Who stands behind an instance, and what a resent enrollment gets back.

The fleet's enrollment token is baked into every image, and instance ids are predictable
(``C.$CONTAINER_ID``), so a registration with it proves only that someone holds the image. Three
things follow (the handlers in ``handlers/push.py`` apply them; the SQL is here):

- **Declared ids.** The deployer (admin token) declares each id it creates, ``POST
  /api/v1/admin/instances``, before or while its container starts. An instance the shared token
  enrolled while it was declared is *vouched*; one it enrolled undeclared is not, and no rule
  destroys it or excludes its machine (``unvouched_instances``, read by queries/policies/30_*, 40_*).
  An id the shared token already enrolled undeclared cannot be declared afterwards (409): nobody can
  tell whose agent that was. With ``enroll_declared_only`` the shared token registers declared ids
  only (403 otherwise; the agent keeps its records and retries). Admin registrations and tokens-off
  pushes need no declaration: the operator sent them.
- **Identity is fixed at registration.** An instance's own token may name its ``machine_id`` and
  ``host_id`` once (when its registration named none); a later ``registered`` naming another value
  is a 409 naming the field. An admin may change them.
- **Idempotent enrollment.** An agent sends ``Idempotency-Key`` (a random secret of at least 32
  bytes it keeps beside its token file) with its registration. Its token is then derived from the
  key and the instance id, so the server, which stores only SHA-256 digests, can give the same
  answer to the same key again (a reply lost to a timeout, a restarted agent) without keeping the
  key: the same token, and the events not written twice. Another key, or none, gets 409 naming the
  instance. A token an admin re-issued is not brought back by the key.
"""

from __future__ import annotations

import base64
import hashlib
import re

from ingest.auth import digest
from ingest.errors import BadRequest

IDEMPOTENCY_KEY = re.compile(r"[A-Za-z0-9_-]{43,128}")  # secrets.token_urlsafe(32) or longer
IDENTITY = ("machine_id", "host_id")


def parse_key(header: str | None) -> str | None:
    """The ``Idempotency-Key`` header of an enrollment, or None (400 when it is too weak to derive a token from)."""
    if header is None:
        return None
    if not IDEMPOTENCY_KEY.fullmatch(header):
        raise BadRequest("Idempotency-Key: expected 43 to 128 characters of [A-Za-z0-9_-] (32 random bytes, base64url)")
    return header


def derive_token(key: str, instance_id: str) -> tuple[str, str]:
    """The instance token that ``key`` enrolls ``instance_id`` with (auth.INSTANCE_TOKEN's shape), and its digest."""
    raw = hashlib.sha256(b"fleetlog-enrollment\0" + instance_id.encode() + b"\0" + key.encode()).digest()
    token = "fli_" + base64.urlsafe_b64encode(raw).decode().rstrip("=")
    return token, digest(token)


def states(cursor, instance_ids: list[str]) -> dict[str, tuple[bool, bool]]:
    """(declared, vouched) of those of ``instance_ids`` with a row (a reader's cursor)."""
    rows = cursor.execute(
        "SELECT instance_id, declared_at IS NOT NULL, vouched FROM enrollments "
        "WHERE instance_id IN (SELECT unnest(?::VARCHAR[]))", [instance_ids]).fetchall()
    return {instance_id: (declared, vouched) for instance_id, declared, vouched in rows}


def identity(cursor, instance_id: str) -> dict[str, int | None]:
    """The stored machine_id and host_id of an instance (a reader's cursor)."""
    row = cursor.execute("SELECT machine_id, host_id FROM instances WHERE instance_id = ?", [instance_id]).fetchone()
    return dict(zip(IDENTITY, row)) if row else {}


def declare(con, instance_ids: list[str], now_us: int) -> None:
    """The writer's transaction: the ids the operator created. An id with a row keeps it (declared
    already, or enrolled undeclared: the handler refused that one)."""
    con.execute(
        "INSERT INTO enrollments SELECT id, make_timestamp(?), NULL::TIMESTAMP, true "
        "FROM (SELECT unnest(?::VARCHAR[]) AS id) WHERE id NOT IN (SELECT instance_id FROM enrollments)",
        [now_us, instance_ids])


def record_enrolled(con, instance_ids: list[str], now_us: int) -> None:
    """The writer's transaction: the shared token enrolled these ids; the declared ones are vouched,
    the others get a row saying they are not."""
    con.execute("UPDATE enrollments SET enrolled_at = make_timestamp(?) "
                "WHERE instance_id IN (SELECT unnest(?::VARCHAR[]))", [now_us, instance_ids])
    con.execute(
        "INSERT INTO enrollments SELECT id, NULL::TIMESTAMP, make_timestamp(?), false "
        "FROM (SELECT unnest(?::VARCHAR[]) AS id) WHERE id NOT IN (SELECT instance_id FROM enrollments)",
        [now_us, instance_ids])
