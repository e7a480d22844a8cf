"""``fleetlog``: the operator's command (``serve`` now; ``query``, ``policy``, ``demo`` to come)."""

from __future__ import annotations

import argparse
import logging
import sys

from aiohttp import web

from ingest import config
from ingest.errors import ConfigError, StoreError

logger = logging.getLogger("fleetlog")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleetlog", description="fleetlog: the flight recorder of a GPU fleet")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the ingest server (HTTP API, writer, page)")
    config.add_arguments(serve)
    return parser


def serve(args: dict) -> int:
    from ingest.app import create_app

    try:
        settings = config.load(args)
    except ConfigError as e:
        print(f"fleetlog: configuration error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        app = create_app(settings)
        logger.info("fleetlog serving on http://%s:%d (database %s)", settings.host, settings.port, settings.db)
        web.run_app(app, host=settings.host, port=settings.port, access_log=None, print=None, shutdown_timeout=10)
    except StoreError as e:
        logger.error("%s", e)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = vars(_parser().parse_args(argv))
    command = args.pop("command")
    if command == "serve":
        return serve(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
