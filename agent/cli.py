"""``fleetlog-agent``: parse the invocation, set up logging, run the command, return its exit code."""

from __future__ import annotations

import asyncio
import logging
import sys

from agent import commands
from agent.config import ConfigError, load
from agent.state import StateDirBusy

EX_USAGE = 2


def main(argv: list[str] | None = None) -> int:
    try:
        inv = load(sys.argv[1:] if argv is None else argv)
    except ConfigError as e:
        print(f"fleetlog-agent: {e}", file=sys.stderr)
        return EX_USAGE
    logging.basicConfig(format="fleetlog-agent: %(levelname)s %(name)s: %(message)s", level=inv.settings.log_level.upper(), stream=sys.stderr)
    handler = {"run": commands.run_command, "wrap": commands.run_command, "tail": commands.tail_command, "event": commands.event_command}[inv.command]
    try:
        return asyncio.run(handler(inv))
    except StateDirBusy as e:
        print(f"fleetlog-agent: {e}", file=sys.stderr)
        return commands.EX_TEMPFAIL


if __name__ == "__main__":
    sys.exit(main())
