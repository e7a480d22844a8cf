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
"""

from __future__ import annotations

import logging
import os
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
