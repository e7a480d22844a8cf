"""The server's settings: the only module that reads argv, ``os.environ`` or ``fleetlog.toml``.

Precedence: command-line flags, then ``FLEETLOG_<NAME>`` environment variables, then the
``[serve]`` table of an optional ``fleetlog.toml`` (``--config PATH``, ``FLEETLOG_CONFIG``, or
``./fleetlog.toml`` when present), then the defaults below. A value that does not parse stops
start-up with the setting's name in the message; it is never replaced by a default.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.resources
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ingest.budget import EXPANSION
from ingest.errors import ConfigError

ENV_PREFIX = "FLEETLOG_"


def _default_queries_dir() -> Path:
    """``queries/`` as package data (so a wheel works from any directory); the checkout's when an
    install left the package out (an image that sets FLEETLOG_QUERIES_DIR instead)."""
    try:
        return Path(str(importlib.resources.files("queries")))
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent.parent / "queries"


DEFAULT_QUERIES_DIR = _default_queries_dir()
TRUE_WORDS = {"1", "true", "yes", "on"}
FALSE_WORDS = {"0", "false", "no", "off"}


def _setting(default: Any, help: str, *, minimum: float | None = None, aliases: tuple[str, ...] = ()) -> Any:
    return field(default=default, metadata={"help": help, "minimum": minimum, "aliases": aliases})


@dataclass(frozen=True)
class Settings:
    host: str = _setting("127.0.0.1", "address the HTTP server binds to")
    port: int = _setting(8080, "TCP port of the HTTP server", minimum=0)
    db: str = _setting("./var/fleetlog.duckdb", "path of the DuckDB database file (created if missing)")
    max_body_bytes: int = _setting(16 * 1024 * 1024, "largest request body accepted, after gzip decompression", minimum=1)
    max_line_bytes: int = _setting(256 * 1024, "longer log lines are truncated to this many bytes and flagged", minimum=16)
    batch_max_rows: int = _setting(250_000, "the writer commits once a batch holds this many rows", minimum=1)
    # 5 ms, not 2: at 8 connections a commit then holds ~1.7x the lines (300 k 100-line pushes, 448 -> 767
    # rows a commit) and the server spends 38 -> 28 us of CPU a line for 25 -> 32 k lines/s (a commit's fixed
    # cost is ~10 ms: bench/commit_statements.py); 10 ms gathered no more. A lone push waits 3 ms longer.
    batch_max_delay_s: float = _setting(0.005, "the writer waits at most this long for more requests before committing", minimum=0)
    queue_max_rows: int = _setting(500_000, "rows waiting for the writer before pushes are refused with 503", minimum=1)
    retry_after_s: int = _setting(1, "Retry-After sent with 503 when the writer queue is full", minimum=0)
    query_timeout_s: float = _setting(
        10.0, "a read or SQL API query, or one policy rule, is interrupted after this long", minimum=0.01
    )
    query_max_rows: int = _setting(10_000, "the SQL API returns at most this many rows", minimum=1)
    tail_cache_lines: int = _setting(1000, "most recent lines kept in memory per (instance, source) for fast tails", minimum=0)
    tail_cache_max_streams: int = _setting(2000, "streams kept in the tail cache (least recently used leave first)", minimum=0)
    gpu_gauge_window_s: float = _setting(120.0, "GPU samples older than this drop out of /metrics", minimum=1)
    gpu_gauge_max_series: int = _setting(
        20_000, "GPU series on /metrics at most, over all instances (beyond: dropped and counted)", minimum=1
    )
    gpu_gauge_max_series_per_instance: int = _setting(
        2_000, "GPU series on /metrics at most per instance (beyond: dropped and counted)", minimum=1
    )
    otlp_grpc_port: int = _setting(4317, "port of the OTLP/gRPC receiver (0 disables it)", minimum=0)
    enroll_token: str = _setting("", "fleet enrollment token: lets an agent register (empty: tokens off)")
    enroll_declared_only: bool = _setting(
        False, "the enrollment token registers only ids an admin declared (POST /api/v1/admin/instances); others 403"
    )
    enroll_max_per_s: float = _setting(
        1.0, "instances the enrollment token may register per second on this node (enroll_burst at once) before 429", minimum=0.001
    )
    enroll_burst: int = _setting(30, "instances the enrollment token may register at once before enroll_max_per_s applies", minimum=1)
    enroll_max_ids_per_request: int = _setting(10, "most instances one registration with the enrollment token names; 413 beyond", minimum=1)
    read_token: str = _setting("", "token for the read and SQL APIs, the page's data and /metrics")
    admin_token: str = _setting("", "token for operator verdicts and executing decisions (and everything else)")
    allow_open_bind: bool = _setting(False, "allow binding a non-loopback address with no token configured")
    instance_max_rows_per_s: float = _setting(
        50_000.0, "rows per second one instance may push (twice that in a burst) before 429 (0: no limit)", minimum=0
    )
    log_level: str = _setting("INFO", "logging level of the server (DEBUG, INFO, WARNING, ERROR)")
    queries_dir: str = _setting("", "directory of the SQL files, policies/ holding the rules (empty: the project's queries/)")
    min_rate: float = _setting(29.0, "benchmark rate in proofs/hour below which an instance is destroyed", minimum=0)
    policy_interval_s: float = _setting(
        60.0, "seconds between policy runs in the server (0 disables the timer); a logs_complete stored brings the next forward", minimum=0, aliases=("--policy-interval",)
    )
    policy_full_interval_s: float = _setting(
        10.0, "the timer runs every rule at most this often; the runs between run only the failure class, the destroy "
        "and machine-exclusion rules (0: every run runs every rule)", minimum=0
    )
    policy_execute: bool = _setting(False, "carry out decisions (destroy, delete logs); without it policies only propose")
    destroy_grace_s: float = _setting(600.0, "a destroy waits for logs_complete, or this long after the benchmark ended", minimum=0)
    destroy_cap_per_cycle: int = _setting(
        3, "most actuator calls for destroys in one policy run (the longest waiting first; the rest wait)", minimum=0
    )
    bad_host_ttl_s: float = _setting(7 * 86400.0, "how long a rule's exclusion of a machine lasts", minimum=0)
    stale_ttl_s: float = _setting(3600.0, "an instance silent this long is marked stale", minimum=0)
    retention_s: float = _setting(30 * 86400.0, "logs and metrics of a stale instance are deleted this long after", minimum=0)
    actuator_webhook_url: str = _setting("", "URL a decision is POSTed to as JSON when carried out")
    actuator_command: str = _setting("", "command run to carry out a destroy, e.g. 'vastai destroy instance {instance_id}'")
    actuator_timeout_s: float = _setting(30.0, "an actuator call is abandoned after this long", minimum=0.01)
    actuator_retries: int = _setting(3, "attempts of an actuator call before its decision is marked failed", minimum=1)
    query_max_concurrent: int = _setting(2, "SQL API queries run at once (their own threads); beyond it 429 with Retry-After", minimum=1)
    query_max_result_bytes: int = _setting(
        32 * 2**20, "bytes a SQL API answer may take as rendered (JSON, CSV or Arrow); 413 beyond; held against memory_budget_mb "
        "while it is built and sent", minimum=1024,
    )
    search_max_concurrent: int = _setting(
        2, "log searches (fleet-wide, and an instance's lines with q=) run at once (their own threads); beyond it 429 "
        "with Retry-After", minimum=1,
    )
    # DuckDB keeps every block a checkpoint writes in its buffer pool until the limit is reached: at 256 the pool held
    # 194 MiB after 10 M lines (121 of them such blocks) and the server's RSS was 441-460 MiB; at 160, 136 MiB and
    # 377-394 MiB, with the same bytes per line and in-process search times (bench/vs_victorialogs.py, 2026-12-05).
    # At 128 the checkpoints (a quarter of the limit: 32 MB of WAL) left 2 more bytes a line free in the file.
    duckdb_memory_limit_mb: int = _setting(
        160, "DuckDB's memory_limit (its cache of stored blocks included); bigger queries spill to a temp directory next to "
        "the database, or fail with 400", minimum=16
    )
    duckdb_checkpoint_mb: int = _setting(
        64, "WAL size at which DuckDB checkpoints: smaller, a faster restart after a crash; larger, fewer rewrites "
        "(at DuckDB's 16 a file kept a quarter of its blocks free); at most a quarter of duckdb_memory_limit_mb "
        "(40 at its default), not below 16 (file mode only)", minimum=1,
    )
    max_lines_per_request: int = _setting(50_000, "most log lines (or metric samples, OTLP records) in one request; 413 beyond", minimum=1)
    max_streams_per_request: int = _setting(1_000, "most log streams in one request; 413 beyond", minimum=1)
    max_events_per_request: int = _setting(1_000, "most lifecycle events in one request; 413 beyond", minimum=1)
    max_streams_per_instance: int = _setting(
        10_000, "most log streams (source, run_id) one instance may hold; a push that would open more is refused 413", minimum=1
    )
    memory_budget_mb: int = _setting(
        512, "memory for bodies in flight, the writer queue, the tail cache and DuckDB together; 503 beyond", minimum=64
    )
    tail_cache_max_bytes: int = _setting(0, "bytes the tail cache may hold over all streams (0: one eighth of memory_budget_mb)", minimum=0)
    http_header_timeout_s: float = _setting(10.0, "a connection that has not sent a whole request head this long after opening is closed", minimum=0.01)
    http_body_timeout_s: float = _setting(60.0, "a request body not received within this long is refused with 408", minimum=0.01)
    http_idle_timeout_s: float = _setting(60.0, "an idle keep-alive connection (or one trickling its next request head) is closed after this long", minimum=0.01)
    http_max_connections: int = _setting(
        0, "open HTTP connections at most; beyond it new ones are closed at once (0: the file-descriptor limit less 256)", minimum=0
    )
    bench_timeout_s: float = _setting(
        3600.0, "a benchmark started this long ago with no bench_done is hung (class hung, destroy proposed)", minimum=1
    )
    exclude_repeat_failures: int = _setting(
        2, "failures of a class not blamed at once (oom_host, network, param_fetch, timeout, hung, unknown) on one machine "
        "within bad_host_ttl_s before it is excluded", minimum=1
    )
    notify_webhook_url: str = _setting("", "URL a decision is POSTed to as JSON when proposed, superseded, executed or failed")
    spike_failures: int = _setting(
        5, "failures of one class on one GPU model within spike_window_s that make a spike, notified once per episode "
        "with a link to the page (0: off)", minimum=0)
    spike_window_s: float = _setting(600.0, "the window of spike_failures", minimum=1)
    public_url: str = _setting("", "base URL the page is reached at, for links in notifications and alert annotations "
                                   "(fleetlog_page_info); empty: http://host:port")
    degrade_recent_runs: int = _setting(
        3, "a machine's recent rate is the mean of its last this many measured benchmark runs (exit 0, a rate), beside its best",
        minimum=1)
    degrade_fraction: float = _setting(
        0.8, "a machine whose recent rate is below this fraction of its best rate is degraded (0: never)", minimum=0)
    degrade_action: str = _setting(
        "flag", "what a degraded machine gets: flag (shown, still eligible), exclude (not eligible while degraded), "
        "rebenchmark (a re-benchmark proposed, sent to notify_webhook_url)")
    lake: str = _setting("", "lake mode: 'postgres:<libpq string>' of the DuckLake catalog and keyed tables (empty: the single file db)")
    lake_data: str = _setting("./var/lake", "lake mode: directory holding the lake's Parquet files, shared by every node")
    node_id: str = _setting("", "lake mode: this node's name, unique among the nodes of a lake (empty: host:port)")
    advertise_url: str = _setting("", "lake mode: base URL other nodes forward pushes to (empty: http://host:port)")
    lake_lease_s: float = _setting(6.0, "lake mode: how long a node's lease on its instances lasts without renewal", minimum=1)
    duckdb_threads: int = _setting(
        0, "DuckDB's worker threads; 0: one on a host of up to 4 cores (a waiting statement spins), else one per core",
        minimum=0,
    )
    lake_maintenance_interval_s: float = _setting(
        300.0, "lake mode: how often one node of the lake merges files, expires snapshots and deletes old files (0: never)",
        minimum=0)
    lake_snapshot_keep_s: float = _setting(3600.0, "lake mode: maintenance expires lake snapshots older than this (the oldest a query may read)",
                                           minimum=0)
    forward_timeout_s: float = _setting(
        10.0, "lake mode: how long a push forwarded to its instance's owner may take before the client gets 503 + Retry-After",
        minimum=0.1,
    )

    @property
    def tokens_enabled(self) -> bool:
        return bool(self.enroll_token or self.read_token or self.admin_token)

    @property
    def loopback(self) -> bool:
        return self.host in ("localhost", "::1") or self.host.startswith("127.")

    @property
    def queries_path(self) -> Path:
        return Path(self.queries_dir) if self.queries_dir else DEFAULT_QUERIES_DIR

    @property
    def page_url(self) -> str:
        """The page's base URL for links: public_url, else this server's own address."""
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")

    @property
    def tail_cache_bytes(self) -> int:
        return self.tail_cache_max_bytes or self.memory_budget_mb * 2**20 // 8

    def memory_split(self) -> dict[str, int]:
        """How ``memory_budget_mb`` is shared, in bytes: the tail cache, DuckDB's memory_limit, an
        eighth kept for transients (the body being parsed, the writer's Arrow copy of a batch), and
        what is left for requests in flight (bodies read, parsed, queued for the writer)."""
        budget = self.memory_budget_mb * 2**20
        duckdb_bytes = self.duckdb_memory_limit_mb * 2**20
        headroom = budget // 8
        return {"tail_cache": self.tail_cache_bytes, "duckdb": duckdb_bytes, "transients": headroom,
                "requests": budget - self.tail_cache_bytes - duckdb_bytes - headroom}

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            minimum = f.metadata.get("minimum")
            value = getattr(self, f.name)
            if minimum is not None and value < minimum:
                raise ConfigError(f"{f.name}: must be >= {minimum}, got {value!r}")
        if not self.tokens_enabled and not self.loopback and not self.allow_open_bind:
            raise ConfigError(
                f"host: {self.host} is not loopback and no token is configured; set enroll_token, read_token and "
                "admin_token (FLEETLOG_*_TOKEN), or allow_open_bind to expose an open server"
            )
        if self.public_url and not self.public_url.startswith(("http://", "https://")):
            raise ConfigError(f"public_url: expected an http:// or https:// URL, got {self.public_url!r}")
        if self.actuator_webhook_url and self.actuator_command:
            raise ConfigError("actuator_webhook_url, actuator_command: set one actuator, not both")
        if self.degrade_fraction > 1:
            raise ConfigError(f"degrade_fraction: must be <= 1 (a fraction of the best rate), got {self.degrade_fraction!r}")
        if self.degrade_action not in ("flag", "exclude", "rebenchmark"):
            raise ConfigError(f"degrade_action: expected flag, exclude or rebenchmark, got {self.degrade_action!r}")
        if self.log_level.upper() not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
            raise ConfigError(f"log_level: expected DEBUG, INFO, WARNING or ERROR, got {self.log_level!r}")
        split = self.memory_split()
        if split["requests"] < EXPANSION * self.max_body_bytes:
            raise ConfigError(
                f"memory_budget_mb: {self.memory_budget_mb} MiB leaves {split['requests'] // 2**20} MiB for requests after the "
                f"tail cache ({split['tail_cache'] // 2**20} MiB, tail_cache_max_bytes), DuckDB ({split['duckdb'] // 2**20} MiB, "
                f"duckdb_memory_limit_mb) and transients ({split['transients'] // 2**20} MiB, an eighth); requests need at "
                f"least {EXPANSION}x max_body_bytes "
                f"({EXPANSION * self.max_body_bytes // 2**20} MiB)"
            )


def _cast(name: str, kind: type, raw: Any, origin: str) -> Any:
    """Convert ``raw`` to ``kind`` or raise a ConfigError that names the setting and where it came from."""
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in TRUE_WORDS | FALSE_WORDS:
            return raw.lower() in TRUE_WORDS
        raise ConfigError(f"{origin}: expected true or false, got {raw!r}")
    if isinstance(raw, kind) and not (kind is int and isinstance(raw, bool)):
        return raw
    if kind is float and isinstance(raw, int) and not isinstance(raw, bool):
        return float(raw)
    if isinstance(raw, str):
        try:
            return kind(raw) if kind is not str else raw
        except ValueError:
            pass
    raise ConfigError(f"{origin}: expected {kind.__name__}, got {raw!r}")


def _types() -> dict[str, type]:
    hints = {"str": str, "int": int, "float": float, "bool": bool}
    return {f.name: hints[f.type] for f in dataclasses.fields(Settings)}


def add_arguments(parser: argparse.ArgumentParser, only: frozenset[str] | None = None) -> None:
    """Add one ``--flag`` per setting (those named in ``only``, when given); the defaults stay None so
    that unset flags do not override."""
    parser.add_argument("--config", help="path of a fleetlog.toml (default ./fleetlog.toml when present)")
    for f in dataclasses.fields(Settings):
        if only is not None and f.name not in only:
            continue
        flag = "--" + f.name.replace("_", "-")
        extra = {"nargs": "?", "const": "true"} if f.type == "bool" else {}
        parser.add_argument(flag, *f.metadata["aliases"], dest=f.name, default=None, help=f"{f.metadata['help']} (default {f.default!r}; env {ENV_PREFIX}{f.name.upper()})", **extra)


def load(args: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> Settings:
    """Build the Settings from flags (``args``), the environment and the TOML file."""
    args = dict(args or {})
    environ = os.environ if environ is None else environ
    types = _types()
    values: dict[str, Any] = {}

    config_path = args.pop("config", None) or environ.get(ENV_PREFIX + "CONFIG")
    default_path = (cwd or Path.cwd()) / "fleetlog.toml"
    if config_path or default_path.exists():
        path = Path(config_path) if config_path else default_path
        try:
            table = tomllib.loads(path.read_text()).get("serve", {})
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"{path}: cannot read configuration: {e}") from e
        for key, raw in table.items():
            name = key.replace("-", "_")
            if name not in types:
                raise ConfigError(f"{path}: [serve] {key}: unknown setting")
            values[name] = _cast(name, types[name], raw, f"{path}: [serve] {key}")

    for name, kind in types.items():
        env_name = ENV_PREFIX + name.upper()
        if env_name in environ:
            values[name] = _cast(name, kind, environ[env_name], env_name)
        if args.get(name) is not None:
            values[name] = _cast(name, kind, args[name], "--" + name.replace("_", "-"))
    return Settings(**values)


# ---- the operator commands' side: which server to talk to, with which token

@dataclass(frozen=True)
class ClientSettings:
    """Where ``fleetlog logs``, ``query --server``, ``policy run --server``, ``demo``... send requests."""

    server: str
    token: str


CLIENT_HELP = {
    "server": "URL of the fleetlog server (env FLEETLOG_SERVER, [client] server in fleetlog.toml; "
              "default http://HOST:PORT of the serve settings)",
    "token": "token sent as Authorization: Bearer (env FLEETLOG_TOKEN, [client] token in fleetlog.toml; "
             "default the admin, else the read token of the serve settings)",
}


def add_client_arguments(parser: argparse.ArgumentParser, config: bool = True) -> None:
    """``--server`` and ``--token`` (and ``--config``, unless the parser has it already). Unset, they
    leave no attribute (``SUPPRESS``), so the same flags on the top-level parser (before the
    subcommand) and on a subcommand's parser (after it) can both be given without one erasing the other."""
    parser.add_argument("--server", default=argparse.SUPPRESS, help=CLIENT_HELP["server"])
    parser.add_argument("--token", default=argparse.SUPPRESS, help=CLIENT_HELP["token"])
    if config:
        parser.add_argument("--config", default=None, help="path of a fleetlog.toml (default ./fleetlog.toml when present)")


def load_client(args: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None,
                cwd: Path | None = None) -> ClientSettings:
    """The server URL and token, the way every setting is read: flag, then ``FLEETLOG_SERVER`` /
    ``FLEETLOG_TOKEN``, then the ``[client]`` table of fleetlog.toml, then the serve settings (so an
    operator on the server's machine needs nothing more)."""
    args = dict(args or {})
    environ = os.environ if environ is None else environ
    config_path = args.get("config") or environ.get(ENV_PREFIX + "CONFIG")
    default_path = (cwd or Path.cwd()) / "fleetlog.toml"
    table: dict[str, Any] = {}
    if config_path or default_path.exists():
        path = Path(config_path) if config_path else default_path
        try:
            table = tomllib.loads(path.read_text()).get("client", {})
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"{path}: cannot read configuration: {e}") from e
        for key in table:
            if key not in CLIENT_HELP:
                raise ConfigError(f"{path}: [client] {key}: unknown setting (known: server, token)")
    values: dict[str, str] = {}
    for name in CLIENT_HELP:
        for raw, origin in ((args.get(name), "--" + name), (environ.get(ENV_PREFIX + name.upper()), ENV_PREFIX + name.upper()),
                            (table.get(name), f"[client] {name}")):
            if raw is not None:
                values[name] = _cast(name, str, raw, origin)
                break
    if "server" not in values or "token" not in values:
        serve = load({"config": args.get("config")}, environ, cwd)
        host = "127.0.0.1" if serve.host in ("0.0.0.0", "::", "") else serve.host
        values.setdefault("server", f"http://{host}:{serve.port}")
        values.setdefault("token", serve.admin_token or serve.read_token)
    server = values["server"].rstrip("/")
    if not server.startswith(("http://", "https://")):
        raise ConfigError(f"server: expected an http:// or https:// URL, got {server!r}")
    return ClientSettings(server=server, token=values["token"])
