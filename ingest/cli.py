"""``fleetlog``: the operator's command.

    fleetlog serve [settings...]                        run the server
    fleetlog logs INSTANCE [--source S] [--tail N] [--follow] [--grep RE]
    fleetlog instances [--state S] [--failed]           the fleet, one row per instance
    fleetlog why INSTANCE [--diff]                      why it failed: exit, class, deciding line, logs, decisions
                                                        (--diff: where it parts from a healthy run of its GPU model)
    fleetlog patterns [PATTERN_ID]                      failures by deciding line's template: who shares each
    fleetlog hosts                                      the deploy gate, one row per machine
    fleetlog search TEXT [--since 24h] [--regex]        log lines across the fleet, newest first
    fleetlog query SQL | --file NAME [-x]               ask the stored data (read-only SQL; -x one field a line)
    fleetlog policy run [--once] [--execute]            run the lifecycle rules (dry run unless --execute;
                                                        exit 1 when a destroy or deletion asked for was not done)
    fleetlog demo                                       push a simulated fleet through the real agent

Every command but ``serve`` talks to a server: ``--server`` / ``FLEETLOG_SERVER`` / ``[client] server``
of fleetlog.toml (default the serve settings' address), with ``--token`` / ``FLEETLOG_TOKEN`` /
``[client] token``; both flags go before or after the subcommand (``fleetlog --server URL why C.1``). ``query`` and ``policy run`` open a database file instead with ``--db``.
"""

from __future__ import annotations

import argparse
import importlib.util
import asyncio
import logging
import sys
import time
from pathlib import Path

import orjson

from ingest import config, oncall
from ingest.client import Client, ClientError
from ingest.errors import ConfigError, StoreError

logger = logging.getLogger("fleetlog")

FORMATS = ("table", "json", "csv")

# What a policy run depends on: shown by `policy run --help` (and read from flags, env and toml).
POLICY_SETTINGS = frozenset({
    "db", "queries_dir", "query_timeout_s", "log_level", "min_rate", "policy_interval_s", "destroy_grace_s",
    "destroy_cap_per_cycle", "bad_host_ttl_s", "stale_ttl_s", "retention_s", "actuator_webhook_url",
    "actuator_command", "actuator_timeout_s", "actuator_retries",
})


def _client_command(commands, name: str, help: str, description: str | None = None) -> argparse.ArgumentParser:
    parser = commands.add_parser(name, help=help, description=description or help)
    config.add_client_arguments(parser)
    return parser


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleetlog", description="fleetlog: the flight recorder of a GPU fleet")
    config.add_client_arguments(parser, config=False)  # global: before the subcommand too, as logcli / psql
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the ingest server (HTTP API, writer, policy timer)")
    config.add_arguments(serve)

    logs = _client_command(commands, "logs", "an instance's log lines, oldest first (--follow: then new ones)")
    logs.add_argument("instance", help="the instance id, e.g. C.32733029")
    logs.add_argument("--source", help="one source (benchout, benchdaemon, setup...); default all")
    logs.add_argument("--tail", type=int, default=200, help="the last N lines (default %(default)s)")
    logs.add_argument("--follow", "-f", action="store_true", help="then print new lines as they are stored (needs --source)")
    logs.add_argument("--grep", metavar="RE", help="only lines matching this regular expression (case-insensitive)")
    logs.add_argument("--format", choices=FORMATS, default="table", help="table: plain lines; json: one object a line")

    instances = _client_command(commands, "instances", "the fleet: state, machine, GPU, rate, exit, failure class, logs")
    instances.add_argument("--state", help="only instances in this state (running, bench_done, killed, stale...)")
    instances.add_argument("--failed", action="store_true", help="only instances whose latest benchmark failed")
    instances.add_argument("--format", choices=FORMATS, default="table")

    why = _client_command(commands, "why", "why an instance failed: exit, class, deciding line, excerpt, logs, decisions")
    why.add_argument("instance", help="the instance id")
    why.add_argument("--format", choices=FORMATS, default="table")
    why.add_argument("--diff", action="store_true", help="then where its run parts from the latest healthy run of the "
                     "same GPU model: per source, the first lines whose templates differ")

    patterns = _client_command(commands, "patterns", "failures grouped by the template of their deciding line, and "
                               "which machines, GPU models, drivers and images share each")
    patterns.add_argument("pattern", nargs="?", help="a pattern id: list the failures that share it")
    patterns.add_argument("--format", choices=FORMATS, default="table")

    hosts = _client_command(commands, "hosts", "the deploy gate: per machine, best rate, runs, bad or not, eligible")
    hosts.add_argument("--format", choices=FORMATS, default="table")

    search = _client_command(commands, "search", "log lines across the fleet, newest first (case-insensitive)")
    search.add_argument("text", help="the text to find (a regular expression with --regex)")
    search.add_argument("--regex", action="store_true", help="TEXT is a regular expression (RE2)")
    search.add_argument("--since", default="24h", help="how far back: 30m, 24h, 7d, or a time (default %(default)s)")
    search.add_argument("--until", default=None, help="until when (default now)")
    search.add_argument("--source", help="only this source")
    search.add_argument("--instance", help="only this instance")
    search.add_argument("--limit", type=int, default=100, help="at most this many lines (default %(default)s)")
    search.add_argument("--format", choices=FORMATS, default="table")

    query = commands.add_parser(
        "query",
        help="run one read-only SELECT, against a server or (--db) a database file",
        description="SQL from the command line or a file of queries/ (a path, or its name: why_failed); its "
        "'-- needs:' are put in front. $name parameters come from --param name=value; $now and $min_rate are "
        "filled in when not given.",
    )
    query.add_argument("sql", nargs="?", help="the SELECT to run")
    query.add_argument("--file", help="a .sql file or the name of one in queries/, e.g. why_failed")
    query.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="a $NAME parameter")
    query.add_argument("--format", choices=FORMATS, default="table")
    query.add_argument("-x", "--expanded", action="store_const", const=True, default=None,
                       help="show the table one field a line (psql's expanded mode); by default only a result "
                       "too wide for the terminal (COLUMNS) is")
    query.add_argument("--db", help="the database file, when no server holds it (instead of a server)")
    query.add_argument("--min-rate", type=float, default=None, help="the $min_rate to use (default the server's)")
    config.add_client_arguments(query)

    policy = commands.add_parser("policy", help="lifecycle rules").add_subparsers(dest="policy_command", required=True)
    run = policy.add_parser(
        "run",
        help="run the rules in queries/policies/ (dry run unless --execute)",
        description="On a running server (--server, the default), which runs them with its own settings; or "
        "straight on a database file no server holds (--db), with the settings below. Prints the decisions.",
    )
    run.add_argument("--once", action="store_true", help="one run, then exit (default: every policy interval)")
    run.add_argument("--execute", action="store_true", help="carry out the decisions (destroy, delete logs)")
    run.add_argument("--format", choices=FORMATS, default="table")
    config.add_arguments(run, only=POLICY_SETTINGS)
    config.add_client_arguments(run, config=False)

    demo = _client_command(
        commands, "demo", "push a simulated fleet (healthy, slow, OOM, GPU lost, network failure) into a running server",
        "Runs the real fleetlog-agent for nine simulated instances against the server, then the policies "
        "(with the admin token when the server has tokens on).",
    )
    demo.add_argument("--keep", action="store_true", help="keep the generated scripts and agent logs")
    return parser


def _settings(args: dict) -> config.Settings | None:
    try:
        return config.load(args)
    except ConfigError as e:
        print(f"fleetlog: configuration error: {e}", file=sys.stderr)
        return None


def _client(args: dict) -> Client | None:
    try:
        found = config.load_client({k: args.pop(k, None) for k in ("server", "token", "config")})
    except ConfigError as e:
        print(f"fleetlog: configuration error: {e}", file=sys.stderr)
        return None
    return Client(found.server, found.token)


def _logging(settings: config.Settings) -> None:
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


SERVER_EXTRA = "pip install 'fleetlog[server]'"


def _server_modules(command: str) -> bool:
    """Whether the server's dependencies (the ``server`` extra) are installed; if not, say which install
    brings them, in one line (an agent-only install has the ``fleetlog`` command too)."""
    missing = [name for name in ("duckdb", "grpc", "prometheus_client") if importlib.util.find_spec(name) is None]
    if missing:
        print(f"fleetlog {command}: the server's dependencies are not installed (no module {missing[0]}): "
              f"{SERVER_EXTRA}", file=sys.stderr)
        return False
    return True


def serve(args: dict) -> int:
    if not _server_modules("serve"):
        return 1
    from ingest.app import create_app

    for key in ("server", "token"):  # the global client flags mean nothing to the server itself
        args.pop(key, None)
    settings = _settings(args)
    if settings is None:
        return 2
    _logging(settings)
    from ingest.budget import arrow_on_glibc, start_heap_trimmer

    start_heap_trimmer()  # what the server frees leaves its RSS (the memory budget under a flood)
    logger.info("Arrow buffers from glibc's malloc (pool %s): what is freed leaves the RSS", arrow_on_glibc())
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
    from ingest.web import listener
    from ingest.web.keys import METRICS
    from ingest.metrics import LiveStateCollector

    from ingest.budget import freeze_startup_heap, tune_allocator

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

    def started(site) -> None:
        frozen = freeze_startup_heap()  # after start-up (database open, stream index read): short full GC passes
        logger.info("start-up heap frozen: %d objects left out of the garbage collector's passes", frozen)
        logger.info("fleetlog serving on %s (database %s, at most %d connections)", site.name, settings.db, cap)

    listener.run(app, settings.host, settings.port, guard, idle_timeout_s=settings.http_idle_timeout_s, started=started)


def policy_run(args: dict) -> int:
    once, execute, fmt = args.pop("once"), args.pop("execute"), args.pop("format")
    args.pop("policy_command", None)
    if not args.get("db"):
        client = _client(args)
        if client is None:
            return 2
        interval_s = float(args.get("policy_interval_s") or 60.0)
        return _policy_via_server(client, once, execute, fmt, interval_s)
    if not _server_modules("policy run --db"):  # the rules on a database file: the server's modules
        return 1
    for key in ("server", "token"):
        args.pop(key, None)
    settings = _settings(args)
    if settings is None:
        return 2
    _logging(settings)
    try:
        return asyncio.run(_policy_local(settings, once, execute, fmt))
    except (StoreError, ConfigError) as e:
        print(f"fleetlog: {e}\n(is a server holding the database? then leave out --db: the server runs them)",
              file=sys.stderr)
        return 1


REPORTED = ("new_decisions", "executed", "failed", "superseded", "skipped")
ACTED = ("destroy", "delete_logs")  # what --execute is asked to carry out (the rest take effect at once)


def _decided_ids(report: dict) -> list[int]:
    return sorted({i for key in REPORTED for i in report.get(key, [])})


def not_done(report: dict, proposed: list[dict]) -> list[dict]:
    """With ``execute``, what was asked and not carried out: decisions that failed for good, and destroys
    or deletions still proposed after the run (capped, or an attempt that failed and will be retried)."""
    if not report.get("execute"):
        return []
    failed = set(report.get("failed", []))
    latest = {d["id"]: d for d in proposed}  # one row per decision, however many lists it came in
    return [d for d in latest.values() if d["id"] in failed or (d["state"] == "proposed" and d["action"] in ACTED)]


def print_report(report: dict, decisions: list[dict], left: list[dict], fmt: str) -> int:
    """What one policy run decided and did: a table of its decisions (or JSON / CSV rows), then what it
    was asked to carry out and did not (``left``, from ``not_done``). Returns 1 when something was left,
    or a rule failed."""
    ids = set(_decided_ids(report)) | {d["id"] for d in left}
    rows = sorted({d["id"]: d for d in [*decisions, *left] if d["id"] in ids}.values(), key=lambda d: d["id"])
    if fmt == "table":
        mode = "executed" if report.get("execute") else "dry run"
        sys.stdout.write(f"policy run, {mode}: {report.get('classified', 0)} failures classified, "
                         f"{len(report.get('new_decisions', []))} new decisions, {len(report.get('executed', []))} "
                         f"carried out, {len(report.get('failed', []))} failed, {report.get('capped', 0)} capped"
                         + "".join(f", {len(report[k])} {k}" for k in ("superseded", "skipped") if report.get(k)) + "\n")
    for rule, why in report.get("rule_errors", {}).items():
        sys.stderr.write(f"policy rule {rule} failed: {why} (its decisions were not made; the other rules ran)\n")
    if fmt == "json":
        sys.stdout.write(orjson.dumps({**report, "decisions": rows, "not_done": [d["id"] for d in left]},
                                      default=str).decode() + "\n")
    elif rows or fmt == "csv":
        oncall.print_records(rows, oncall.DECISION_COLUMNS, fmt, sys.stdout)
    if left and fmt == "table":
        sys.stdout.write(f"{len(left)} not carried out:\n" + "".join(
            f"  #{d['id']} {d['action']} {d['subject']}: {d.get('last_error') or 'capped (destroy_cap_per_cycle): next run'}"
            f" (attempts {d.get('attempts', 0)})\n" for d in left))
    sys.stdout.flush()
    if left:
        print(f"fleetlog policy run: {len(left)} of the decisions asked for were not carried out", file=sys.stderr)
    return 1 if left or report.get("rule_errors") else 0  # a rule that failed made none of its decisions


def _policy_via_server(client: Client, once: bool, execute: bool, fmt: str, interval_s: float) -> int:
    while True:
        try:
            report = client.post("/api/v1/policy/run", params={"execute": int(execute)})
            decisions = client.get("/api/v1/decisions", limit=10_000)["decisions"] if _decided_ids(report) else []
            proposed = client.get("/api/v1/decisions", state="proposed", limit=10_000)["decisions"] if report.get("execute") else []
        except ClientError as e:
            print(f"fleetlog policy run: {e.message}", file=sys.stderr)
            return 1
        status = print_report(report, decisions, not_done(report, decisions + proposed), fmt)
        if once or interval_s <= 0:
            return status
        time.sleep(interval_s)


async def _policy_local(settings: config.Settings, once: bool, execute: bool, fmt: str) -> int:
    from prometheus_client import CollectorRegistry

    from ingest.db import reads
    from ingest.core import Core
    from ingest.metrics import IngestMetrics

    core = Core.open(settings, IngestMetrics(CollectorRegistry()))
    try:
        while True:
            report = (await core.policy.run_cycle(execute)).as_dict()
            decisions = core.reader.read(reads.decisions, state=None, action=None, subject=None,
                                         limit=10_000) if _decided_ids(report) or execute else []
            status = print_report(report, decisions, not_done(report, decisions), fmt)
            if once or settings.policy_interval_s <= 0:
                return status
            await asyncio.sleep(settings.policy_interval_s)
    finally:
        await core.close()


def _param_value(raw: str):
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw


def _query_file(name: str, queries_dir: Path) -> Path:
    """A path, or the name of a file of queries/ (``why_failed``, ``why_failed.sql``)."""
    path = Path(name)
    if path.exists() or "/" in name:
        return path
    from ingest.db import sqlfiles as queryfiles

    return queryfiles.find(name.removesuffix(".sql"), queries_dir)


def query(args: dict) -> int:
    from ingest.db import sqlfiles as queryfiles
    from ingest.errors import QueryError, QueryTimeout

    if bool(args["sql"]) == bool(args["file"]):
        print("fleetlog query: give either SQL or --file", file=sys.stderr)
        return 2
    local = {"config": args.get("config"), "db": args["db"]}
    settings = _settings(local)
    if settings is None:
        return 2
    try:
        sql = queryfiles.compose(_query_file(args["file"], settings.queries_path), settings.queries_path) if args["file"] else args["sql"]
    except (OSError, QueryError) as e:
        print(f"fleetlog query: {getattr(e, 'message', e)}", file=sys.stderr)
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
    if not args["db"]:
        client = _client(args)
        if client is None:
            return 2
        return _query_via_server(client, sql, given, args["format"], args["expanded"])
    if not _server_modules("query --db"):
        return 1
    try:
        columns, rows = _query_local(settings, sql, given)
    except (QueryError, QueryTimeout) as e:
        print(f"fleetlog query: {e.message}", file=sys.stderr)
        return 1
    except StoreError as e:
        print(f"fleetlog query: {e}", file=sys.stderr)
        return 1
    oncall.print_rows(columns, rows, args["format"], expanded=args["expanded"])
    return 0


def _query_local(settings: config.Settings, sql: str, given: dict) -> tuple[list[str], list[list]]:
    from ingest.db import sqlfiles as queryfiles
    from ingest.db.database import query_file
    from ingest.timestamps import utcnow

    params = queryfiles.bind(sql, given, {"now": utcnow(), "min_rate": settings.min_rate})
    columns, rows = query_file(settings.db, sql, settings.query_timeout_s * 6, 1_000_000, params)
    return columns, [list(r) for r in rows]


def _query_via_server(client: Client, sql: str, params: dict, fmt: str, expanded: bool | None) -> int:
    try:
        data = client.request("POST", "/api/v1/query", params={"format": "csv" if fmt == "csv" else "json"},
                              body=orjson.dumps({"sql": sql, "params": params}))
    except ClientError as e:
        print(f"fleetlog query: {e.message}", file=sys.stderr)
        return 1
    if fmt == "csv":
        sys.stdout.write(data.decode())
        return 0
    doc = orjson.loads(data)
    oncall.print_rows(doc["columns"], doc["rows"], fmt, expanded=expanded)
    return 0


ONCALL = {"logs": oncall.logs, "instances": oncall.instances, "why": oncall.why, "hosts": oncall.hosts,
          "search": oncall.search}
ONCALL["patterns"] = oncall.patterns  # failure patterns (migration 017)


def main(argv: list[str] | None = None) -> int:
    args = vars(_parser().parse_args(argv))
    command = args.pop("command")
    if command == "serve":
        return serve(args)
    if command == "policy":
        return policy_run(args)
    if command == "query":
        return query(args)
    client = _client(args)
    if client is None:
        return 2
    if command == "demo":
        from ingest import demo

        return demo.run(client, args["keep"])
    try:
        return ONCALL[command](client, args)
    except ClientError as e:
        print(f"fleetlog {command}: {e.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # | head
        return 0


if __name__ == "__main__":
    sys.exit(main())
