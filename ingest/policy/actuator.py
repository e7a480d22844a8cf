"""Carrying out a decision outside fleetlog: a webhook, or a command such as ``vastai destroy``.

Behind one seam (``Actuator.carry_out``) so that the policy engine does not know which; the webhook
POSTs through ``notify.post_json``, the one webhook client. Tests use a real local HTTP server and a
real command. Each call has a timeout; retries belong to the engine,
which counts attempts across cycles in the decisions table.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import string
from typing import Any, Protocol

from ingest.contract.codec import check_id
from ingest.policy.notify import WebhookUnreachable, post_json

logger = logging.getLogger(__name__)


class ActuationError(Exception):
    """The actuator did not confirm the action."""


class Actuator(Protocol):
    name: str

    async def carry_out(self, decision: dict[str, Any]) -> str:
        """Do it; return a short confirmation, or raise ActuationError."""
        ...


class NoActuator:
    name = "none"

    async def carry_out(self, decision: dict[str, Any]) -> str:
        raise ActuationError("no actuator configured (set actuator_webhook_url or actuator_command)")


class WebhookActuator:
    name = "webhook"

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url
        self.timeout_s = timeout_s

    async def carry_out(self, decision: dict[str, Any]) -> str:
        try:
            status, text = await post_json(self.url, decision, self.timeout_s)
        except WebhookUnreachable as e:
            raise ActuationError(f"webhook unreachable: {e}") from e
        if status // 100 != 2:
            raise ActuationError(f"webhook answered {status}: {text}")
        return f"webhook {status}"


class CommandActuator:
    """Runs ``template`` with ``{instance_id}``, ``{machine_id}``, ``{subject}``, ``{action}``, ``{id}``
    substituted in each argument after splitting (no shell: a value cannot inject a command).

    Every substituted value must pass the id rule (``codec.check_id``: printable, bounded, not
    starting with ``-``), so that no value can arrive as an option of the command (``--help``,
    ``-rf``) or smuggle control characters; otherwise the call is refused and nothing runs.
    """

    name = "command"

    def __init__(self, template: str, timeout_s: float) -> None:
        self.argv = shlex.split(template)
        self.timeout_s = timeout_s

    async def carry_out(self, decision: dict[str, Any]) -> str:
        evidence = decision.get("evidence") or {}
        fields = {
            "instance_id": decision["subject"], "subject": decision["subject"], "action": decision["action"],
            "id": decision["id"], "machine_id": evidence.get("machine_id", ""),
        }
        try:
            used = {name for arg in self.argv for _text, name, _spec, _conv in string.Formatter().parse(arg) if name}
            for name in sorted(used):
                why = check_id(str(fields[name]))
                if why is not None:
                    raise ActuationError(f"refused to substitute {name}={str(fields[name])[:40]!r}: {why}")
            argv = [arg.format(**fields) for arg in self.argv]
        except (KeyError, IndexError, ValueError) as e:
            raise ActuationError(f"command template: {e}") from e
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
            )
        except OSError as e:
            raise ActuationError(f"cannot run {argv[0]}: {e}") from e
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), self.timeout_s)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            raise ActuationError(f"{argv[0]} timed out after {self.timeout_s} s") from None
        text = out.decode("utf-8", "replace").strip()[-300:]
        if proc.returncode != 0:
            raise ActuationError(f"{argv[0]} exited {proc.returncode}: {text}")
        return text or f"{argv[0]} exited 0"


def build_actuator(webhook_url: str, command: str, timeout_s: float) -> Actuator:
    if webhook_url:
        return WebhookActuator(webhook_url, timeout_s)
    if command:
        return CommandActuator(command, timeout_s)
    return NoActuator()
