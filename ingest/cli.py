"""``fleetlog``: the operator's command.

    fleetlog serve [settings...]                 run the server
    fleetlog policy run [--once] [--execute]     run the lifecycle rules (dry run unless --execute)
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import urllib.error
import urllib.request

import orjson
from aiohttp import web

from ingest import config
from ingest.errors import ConfigError, StoreError

logger = logging.getLogger("fleetlog")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleetlog", description="fleetlog: the flight recorder of a GPU fleet")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the ingest server (HTTP API, writer, policy timer)")
    config.add_arguments(serve)

    policy = commands.add_parser("policy", help="lifecycle rules").add_subparsers(dest="policy_command", required=True)
    run = policy.add_parser(
        "run",
        help="run the rules in queries/policies/ (dry run unless --execute)",
        description="Against a running server with --server URL (it holds the database), else straight on "
        "the database file. Every setting of `fleetlog serve` applies (min_rate, grace, actuator...).",
    )
    run.add_argument("--once", action="store_true", help="one run, then exit (default: every policy interval)")
    run.add_argument("--execute", action="store_true", help="carry out the decisions (destroy, delete logs)")
    run.add_argument("--server", help="URL of a running fleetlog server, e.g. http://127.0.0.1:8080")
    config.add_arguments(run)
    return parser


def _settings(args: dict) -> config.Settings | None:
    try:
        return config.load(args)
    except ConfigError as e:
        print(f"fleetlog: configuration error: {e}", file=sys.stderr)
        return None


def _logging(settings: config.Settings) -> None:
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def serve(args: dict) -> int:
    from ingest.app import create_app

    settings = _settings(args)
    if settings is None:
        return 2
    _logging(settings)
    try:
        app = create_app(settings)
        logger.info("fleetlog serving on http://%s:%d (database %s)", settings.host, settings.port, settings.db)
        web.run_app(app, host=settings.host, port=settings.port, access_log=None, print=None, shutdown_timeout=10)
    except (StoreError, ConfigError) as e:
        logger.error("%s", e)
        return 1
    return 0


def policy_run(args: dict) -> int:
    once, execute, server = args.pop("once"), args.pop("execute"), args.pop("server")
    args.pop("policy_command", None)
    settings = _settings(args)
    if settings is None:
        return 2
    _logging(settings)
    if server:
        return _policy_via_server(server, once, execute, settings.policy_interval_s)
    try:
        return asyncio.run(_policy_local(settings, once, execute))
    except (StoreError, ConfigError) as e:
        print(f"fleetlog: {e}\n(is a server holding the database? then use --server URL)", file=sys.stderr)
        return 1


def _print_report(report: dict) -> None:
    sys.stdout.write(orjson.dumps(report).decode() + "\n")
    sys.stdout.flush()


def _policy_via_server(server: str, once: bool, execute: bool, interval_s: float) -> int:
    import time

    url = server.rstrip("/") + f"/api/v1/policy/run?execute={int(execute)}"
    while True:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="POST", data=b""), timeout=120) as r:
                _print_report(orjson.loads(r.read()))
        except urllib.error.HTTPError as e:
            print(f"fleetlog: {url}: {e.code} {e.read().decode(errors='replace')}", file=sys.stderr)
            return 1
        except OSError as e:
            print(f"fleetlog: {url}: {e}", file=sys.stderr)
            return 1
        if once or interval_s <= 0:
            return 0
        time.sleep(interval_s)


async def _policy_local(settings: config.Settings, once: bool, execute: bool) -> int:
    from prometheus_client import CollectorRegistry

    from ingest.core import Core
    from ingest.observe import IngestMetrics

    core = Core.open(settings, IngestMetrics(CollectorRegistry()))
    try:
        if once or settings.policy_interval_s <= 0:
            _print_report((await core.policy.run_cycle(execute)).as_dict())
        else:
            await core.policy.run_forever(settings.policy_interval_s, execute, asyncio.Event())
    finally:
        await core.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = vars(_parser().parse_args(argv))
    command = args.pop("command")
    if command == "serve":
        return serve(args)
    if command == "policy":
        return policy_run(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
