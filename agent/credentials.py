"""Which token the agent presents, and how it gets its own.

The server (``ingest/auth.py``) knows three kinds of token an agent may hold:

- none at all, when the server runs open (loopback, no tokens configured);
- the fleet's *enrollment* token, baked into the image (``FLEETLOG_ENROLL_TOKEN``): it may only
  send ``registered`` events, and the reply to one carries the instance's own token,
  ``{"tokens": {instance_id: token}}``;
- the instance's own token (or an admin token) given as ``--token``, or obtained by enrolling: it
  pushes anything for this instance.

An enrolled token is kept in ``--token-file`` (mode 0600, shared by every agent of the container,
whatever their ``--spool``), so the instance registers once, not once per agent: a later
``registered`` would move the instance's lifecycle back. Enrollment sends the agent's own
``registered`` event when that is the first thing to send, else a minimal one. When the server no
longer knows the token (401), it is forgotten and the agent enrolls again.

Every enrollment carries an ``Idempotency-Key``: 32 random bytes kept beside the token file
(``--token-file`` + ``.key``, 0600, created once, shared the same way), so a registration stored
whose reply was lost (a timeout on a busy server), or resent by a restarted agent or by another agent
of the container, gets the same answer: the same instance token. The key is as secret as the token.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from typing import Any

import orjson

logger = logging.getLogger(__name__)


class Credentials:
    def __init__(
        self,
        instance_id: str,
        *,
        token: str | None,
        enroll_token: str | None,
        token_file: str | None,
        registration: dict[str, Any] | None = None,
    ) -> None:
        self.instance_id = instance_id
        self.given = token or None
        self.enroll_token = enroll_token or None
        self.token_file = token_file
        self.registration = dict(registration or {})
        self.own: str | None = None
        self.open_server = False  # the server issued no token: it runs without tokens
        self._enroll_ts = round(time.time(), 6)  # one ts: a resent enrollment is deduplicated
        self._key: str | None = None  # the Idempotency-Key of our enrollment, read or made on first use
        self._load()

    def _load(self) -> None:
        if self.given or not self.token_file:
            return
        try:
            with open(self.token_file) as f:
                doc = orjson.loads(f.read())
        except FileNotFoundError:
            return
        except (OSError, orjson.JSONDecodeError) as e:
            logger.warning("token file %s unreadable: %s", self.token_file, e)
            return
        if doc.get("instance_id") == self.instance_id and doc.get("token"):
            self.own = doc["token"]

    @property
    def needs_enrollment(self) -> bool:
        if self.given or self.own or self.open_server or not self.enroll_token:
            return False
        self._load()  # another agent of this container may have enrolled meanwhile
        return self.own is None

    def current(self) -> str | None:
        """The token for a push (the enrollment token too when the server turned out to be open)."""
        return self.given or self.own or self.enroll_token

    def enrollment_body(self) -> bytes:
        event = {"instance_id": self.instance_id, "kind": "registered", "ts": self._enroll_ts, "enrolled_by": "fleetlog-agent", **self.registration}
        return orjson.dumps([event])

    @property
    def enroll_key(self) -> str:
        """The enrollment's Idempotency-Key: the one kept beside the token file, else a new one kept there."""
        if self._key is None:
            self._key = self._kept_key() or secrets.token_urlsafe(32)
        return self._key

    def _kept_key(self) -> str | None:
        if not self.token_file:
            return None
        path = f"{self.token_file}.key"
        fresh = secrets.token_urlsafe(32)
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)  # the first agent's wins
        except FileExistsError:
            pass
        except OSError as e:
            logger.warning("cannot keep the enrollment key in %s (%s); a lost reply will need a re-issued token", path, e)
            return None
        else:
            with os.fdopen(fd, "w") as f:
                f.write(fresh)
            return fresh
        for _ in range(50):  # another agent made it: it writes 43 characters right after creating it
            try:
                with open(path) as f:
                    kept = f.read().strip()
            except OSError as e:
                logger.warning("enrollment key %s unreadable: %s", path, e)
                return None
            if len(kept) >= 43:
                return kept
            time.sleep(0.01)
        return None

    def accept(self, reply: bytes) -> None:
        """The answer to a registration sent with the enrollment token."""
        try:
            token = (orjson.loads(reply).get("tokens") or {}).get(self.instance_id)
        except (orjson.JSONDecodeError, AttributeError):
            token = None
        if not token:
            self.open_server = True
            return
        self.own = token
        if self.token_file:
            try:
                os.makedirs(os.path.dirname(os.path.abspath(self.token_file)), exist_ok=True)
                tmp = f"{self.token_file}.{os.getpid()}.tmp"
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(orjson.dumps({"instance_id": self.instance_id, "token": token}))
                os.replace(tmp, self.token_file)
            except OSError as e:
                logger.warning("cannot keep the instance token in %s (%s); this agent only will use it", self.token_file, e)

    def rejected(self) -> bool:
        """The server answered 401. True when enrolling again may help."""
        if self.given or not self.enroll_token or not self.own:
            return False
        logger.warning("the server no longer knows this instance's token; enrolling again")
        self.own = None
        if self.token_file:
            try:
                os.unlink(self.token_file)
            except OSError:
                pass
        return True
