"""``fleetlog``: the operator's command.

    fleetlog serve [settings...]                 run the server
    fleetlog policy run [--once] [--execute]     run the lifecycle rules (dry run unless --execute)
    fleetlog query SQL | --file queries/X.sql    ask the stored data (read-only)
    fleetlog demo [--server URL]                 push a simulated fleet through the real agent
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import urllib.error
import urllib.request

import orjson

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

    query = commands.add_parser(
        "query",
        help="run one read-only SELECT, against a running server (--server) or a database file",
        description="SQL from the command line or a file under queries/ (its '-- needs:' are put in front). "
        "$name parameters come from --param name=value; $now and $min_rate are filled in when not given.",
    )
    query.add_argument("sql", nargs="?", help="the SELECT to run")
    query.add_argument("--file", help="a .sql file, e.g. queries/why_failed.sql")
    query.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="a $NAME parameter")
    query.add_argument("--format", choices=("table", "csv", "json"), default="table")
    query.add_argument("--server", help="URL of a running fleetlog server (it holds the database)")
    query.add_argument("--db", help="the database file, when no server holds it (default ./var/fleetlog.duckdb)")
    query.add_argument("--min-rate", type=float, default=None, help="the $min_rate to use (default the server's)")

    demo = commands.add_parser(
        "demo",
        help="push a simulated fleet (healthy, slow, OOM, GPU lost, network failure) into a running server",
        description="Runs the real fleetlog-agent for six simulated instances against --server, then the policies.",
    )
    demo.add_argument("--server", default="http://127.0.0.1:8080", help="the running server (default %(default)s)")
    demo.add_argument("--token", default=None, help="admin token when the server has tokens on (env FLEETLOG_TOKEN)")
    demo.add_argument("--keep", action="store_true", help="keep the generated scripts and agent logs")
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
        if not settings.tokens_enabled:
            logger.warning("no token configured: the API is open to anyone who can reach %s (loopback only unless "
                           "allow_open_bind)", settings.host)
        _serve_app(app, settings)
    except (StoreError, ConfigError) as e:
        logger.error("%s", e)
        return 1
    return 0


def _serve_app(app, settings: config.Settings) -> None:
    """The listener: a cap on open connections, header, body and idle timeouts, rate-limited logs."""
    from ingest import listener
    from ingest.keys import METRICS
    from ingest.observe import LiveStateCollector

    from ingest.budget import tune_allocator

    tune_allocator()
    metrics = app[METRICS]
    try:
        cap = listener.connection_cap(settings.http_max_connections)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    quiet = listener.QuietLogs(on_suppressed=metrics.log_suppressed.inc)
    for handler in logging.getLogger().handlers:
        handler.addFilter(quiet)
    guard = listener.ConnectionGuard(cap, settings.http_header_timeout_s, metrics.connections_refused.inc,
                                     metrics.header_timeouts.inc)
    metrics.registry.register(LiveStateCollector({"fleetlog_http_connections": ("Open HTTP connections", lambda: guard.open)}))
    listener.run(app, settings.host, settings.port, guard, idle_timeout_s=settings.http_idle_timeout_s,
                 started=lambda site: logger.info("fleetlog serving on %s (database %s, at most %d connections)",
                                                  site.name, settings.db, cap))


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


def _param_value(raw: str):
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw


def query(args: dict) -> int:
    from pathlib import Path

    from ingest import queryfiles, reads
    from ingest.errors import QueryError, QueryTimeout
    from ingest.policy import utcnow

    settings = config.Settings()
    if bool(args["sql"]) == bool(args["file"]):
        print("fleetlog query: give either SQL or --file", file=sys.stderr)
        return 2
    try:
        sql = queryfiles.compose(Path(args["file"]), settings.queries_path) if args["file"] else args["sql"]
    except (OSError, QueryError) as e:
        print(f"fleetlog query: {e}", file=sys.stderr)
        return 2
    given = {}
    for item in args["param"]:
        name, sep, value = item.partition("=")
        if not sep:
            print(f"fleetlog query: --param {item!r}: expected NAME=VALUE", file=sys.stderr)
            return 2
        given[name] = _param_value(value)
    if args["min_rate"] is not None:
        given["min_rate"] = args["min_rate"]
    if args["server"]:
        return _query_via_server(args["server"], sql, given, args["format"])
    try:
        params = queryfiles.bind(sql, given, {"now": utcnow(), "min_rate": settings.min_rate})
        import duckdb

        path = args["db"] or settings.db
        if not Path(path).exists():
            print(f"fleetlog query: no database at {path}", file=sys.stderr)
            return 1
        try:
            con = duckdb.connect(path, read_only=True)
        except duckdb.Error as e:
            print(f"fleetlog query: {e}\n(is a server holding the database? then use --server URL)", file=sys.stderr)
            return 1
        try:
            columns, rows, truncated = reads.run_select(con, sql, settings.query_timeout_s * 6, 1_000_000, params)
        finally:
            con.close()
    except (QueryError, QueryTimeout) as e:
        print(f"fleetlog query: {e.message}", file=sys.stderr)
        return 1
    _print_rows(columns, [list(r) for r in rows], args["format"])
    return 0


def _query_via_server(server: str, sql: str, params: dict, fmt: str) -> int:
    url = server.rstrip("/") + "/api/v1/query?format=" + ("csv" if fmt == "csv" else "json")
    body = orjson.dumps({"sql": sql, "params": params})
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, method="POST"), timeout=300) as r:
            data = r.read()
    except urllib.error.HTTPError as e:
        detail = e.read()
        try:
            detail = orjson.loads(detail)["error"]
        except (ValueError, KeyError, TypeError):
            detail = detail.decode(errors="replace")
        print(f"fleetlog query: {e.code}: {detail}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"fleetlog query: {url}: {e}", file=sys.stderr)
        return 1
    if fmt == "csv":
        sys.stdout.write(data.decode())
        return 0
    doc = orjson.loads(data)
    _print_rows(doc["columns"], doc["rows"], fmt)
    return 0


def _print_rows(columns: list[str], rows: list[list], fmt: str) -> None:
    from ingest.handlers.http import dumps

    if fmt == "json":
        sys.stdout.write(dumps([dict(zip(columns, row)) for row in rows]).decode() + "\n")
    elif fmt == "csv":
        import csv

        writer = csv.writer(sys.stdout)
        writer.writerow(columns)
        writer.writerows(rows)
    else:
        cells = [[_cell(v) for v in row] for row in rows]
        widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
        line = "  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()
        sys.stdout.write(line + "\n" + "  ".join("-" * w for w in widths) + "\n")
        for r in cells:
            sys.stdout.write("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() + "\n")
        sys.stdout.write(f"({len(rows)} row{'s' if len(rows) != 1 else ''})\n")


def _cell(value) -> str:
    text = "" if value is None else str(value)
    text = text.replace("\n", "\\n")
    return text if len(text) <= 120 else text[:117] + "..."


def main(argv: list[str] | None = None) -> int:
    args = vars(_parser().parse_args(argv))
    command = args.pop("command")
    if command == "serve":
        return serve(args)
    if command == "policy":
        return policy_run(args)
    if command == "query":
        return query(args)
    if command == "demo":
        from ingest import demo

        return demo.run(args["server"], args["token"] or os.environ.get("FLEETLOG_TOKEN"), args["keep"])
    return 2


if __name__ == "__main__":
    sys.exit(main())
