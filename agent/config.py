"""The agent's settings: the only module of ``agent/`` that reads argv or ``os.environ``.

Precedence: command-line flags, then the environment, then the defaults below. Identity comes from
``FLEETLOG_SERVER``, ``FLEETLOG_INSTANCE_ID``, ``FLEETLOG_TOKEN``, ``FLEETLOG_MACHINE_ID`` ...; when no
instance id is given, vast.ai's ``CONTAINER_ID`` (e.g. ``32733029``) becomes ``C.32733029``, the
id the marketplace shows. Tuning settings read ``FLEETLOG_AGENT_<NAME>`` (the server's own
``FLEETLOG_<NAME>`` settings live on another machine, but a laptop may run both). A value that does
not parse stops the agent with the flag's or the variable's name in the message; it is never
replaced by a default.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

import orjson

from agent.hostmem import DEFAULT_CGROUP_ROOT, DEFAULT_PROC_ROOT
from agent.result import DEFAULT_RATE_REGEX, compile_rate_regex
from agent.spool import FULL_POLICIES

COMMANDS = ("run", "wrap", "tail", "event")
ALL = COMMANDS
TAILING = ("run", "wrap", "tail")
WRAPPING = ("run", "wrap")
BENCH = ("run",)
GPU = ("run", "tail")  # the benchmark, and the proving daemon's phase
EVENT_KINDS = ("registered", "params_done", "bench_started", "bench_done", "logs_complete", "running", "killed")
DEFAULT_SPOOL = "/var/tmp/fleetlog-agent"
DEFAULT_TOKEN_FILE = "/var/tmp/fleetlog-agent.token"
EVENT_FLUSH_TIMEOUT_S = 30.0
MIN_GPU_INTERVAL_S = 0.05


class ConfigError(Exception):
    """A setting that does not parse; the message names the flag or variable."""


def _setting(default: Any, help: str, *, env: str | None = None, commands: tuple[str, ...] = ALL, minimum: float | None = None, metavar: str | None = None, hidden: bool = False) -> Any:
    return field(default=default, metadata={"help": help, "env": env, "commands": commands, "minimum": minimum, "metavar": metavar, "hidden": hidden})


@dataclass(frozen=True)
class AgentSettings:
    server: str = _setting(None, "base URL of the fleetlog server, e.g. http://10.0.0.2:8080", env="FLEETLOG_SERVER", metavar="URL")
    instance_id: str = _setting(None, "this instance's id (default C.$CONTAINER_ID on vast.ai)", env="FLEETLOG_INSTANCE_ID", metavar="ID")
    token: str | None = _setting(None, "this instance's (or an admin) token, sent as Authorization: Bearer", env="FLEETLOG_TOKEN")
    enroll_token: str | None = _setting(None, "the fleet's enrollment token: registers, and the server returns the instance's own token", env="FLEETLOG_ENROLL_TOKEN")
    token_file: str = _setting(DEFAULT_TOKEN_FILE, "where an enrolled instance token is kept (0600), shared by every agent of the container", env="FLEETLOG_AGENT_TOKEN_FILE", metavar="PATH")
    spool: str = _setting(DEFAULT_SPOOL, "state directory: spool, read positions, run id, captured output", env="FLEETLOG_AGENT_SPOOL", metavar="DIR")
    log_level: str = _setting("WARNING", "the agent's own log level on stderr (DEBUG, INFO, WARNING, ERROR)")
    flush_timeout_s: float = _setting(300.0, "at the end, how long to keep trying to deliver what is left", minimum=0, metavar="S")
    request_timeout_s: float = _setting(30.0, "one HTTP request is abandoned (and retried) after this long", minimum=0.1, metavar="S")
    retry_initial_delay_s: float = _setting(0.5, "first wait before resending after a retryable failure", minimum=0.001, metavar="S")
    retry_max_delay_s: float = _setting(10.0, "longest wait between resends (doubling from the first)", minimum=0.001, metavar="S")
    batch_max_bytes: int = _setting(1024 * 1024, "a request carries about this many bytes of lines at most", minimum=1024)
    batch_max_delay_s: float = _setting(0.2, "a line waits at most this long for others before it is spooled and sent", minimum=0, metavar="S")
    spool_max_bytes: int = _setting(256 * 1024 * 1024, "the spool of unacknowledged records holds at most this many bytes", minimum=64 * 1024)
    spool_full_policy: str = _setting("drop_oldest", f"what a full spool drops: {' or '.join(FULL_POLICIES)} (every dropped line is counted and reported)")
    spool_fsync: bool = _setting(False, "fsync the spool and state at every write (survives a power loss, not only an agent crash)")
    # reading
    tails: tuple[tuple[str, str], ...] = _setting((), "tail a file as a source: SOURCE=PATH, repeatable (env: comma-separated)", commands=TAILING, metavar="SOURCE=PATH")
    poll_interval_s: float = _setting(0.1, "how often files are checked for new lines", commands=TAILING, minimum=0.005, metavar="S")
    rotate_wait_s: float = _setting(2.0, "a file renamed away is read until it has not grown for this long", commands=TAILING, minimum=0, metavar="S")
    max_line_bytes: int = _setting(256 * 1024, "longer lines are cut into pieces of this many bytes", commands=TAILING, minimum=64)
    # the wrapped command
    source: str = _setting(None, "source name of the command's stdout and stderr (run: benchout, wrap: setup)", commands=WRAPPING, metavar="NAME")
    grace_s: float = _setting(10.0, "after forwarding SIGTERM/SIGINT, how long the command has before SIGKILL", commands=WRAPPING, minimum=0, metavar="S")
    max_duration_s: float | None = _setting(None, "the command may run this long: then its process group gets SIGTERM (SIGKILL after --grace-s) and the run is reported as timed out; default no limit", commands=WRAPPING, minimum=0.001, metavar="S")
    done_event: str | None = _setting(None, "event sent with the command's exit code once its lines are stored, e.g. params_done", commands=("wrap",), metavar="KIND")
    # the benchmark
    rate_regex: str = _setting(DEFAULT_RATE_REGEX, "pattern of the rate line; its group 'rate' (or first group) is the number, last match wins", commands=BENCH, metavar="RE")
    machine_id: int | None = _setting(None, "vast.ai machine id (reported in 'registered', and a label of the GPU metrics)", env="FLEETLOG_MACHINE_ID", commands=GPU, minimum=0)
    host_id: int | None = _setting(None, "vast.ai host id", env="FLEETLOG_HOST_ID", commands=BENCH, minimum=0)
    gpu_model: str | None = _setting(None, "GPU model (default: asked of nvidia-smi when present)", env="FLEETLOG_GPU_MODEL", commands=BENCH)
    gpu_count: int | None = _setting(None, "number of GPUs (default: asked of nvidia-smi when present)", env="FLEETLOG_GPU_COUNT", commands=BENCH, minimum=0)
    dph: float | None = _setting(None, "rental price in dollars per hour", env="FLEETLOG_DPH", commands=BENCH, minimum=0)
    location: str | None = _setting(None, "where the machine is, e.g. Norway", env="FLEETLOG_LOCATION", commands=BENCH)
    proofs: int | None = _setting(None, "proofs the benchmark runs (reported in 'bench_started')", commands=BENCH, minimum=0)
    concurrency: int | None = _setting(None, "the benchmark's concurrency", commands=BENCH, minimum=0)
    partition_workers: int | None = _setting(None, "the benchmark's partition workers", commands=BENCH, minimum=0)
    register: bool = _setting(True, "send 'registered' before the benchmark", commands=BENCH)
    # GPU telemetry
    gpu_interval_s: float = _setting(5.0, "sample every GPU through NVML this often and export it over OTLP; 0 turns GPU telemetry off", commands=GPU, minimum=0, metavar="S")
    otlp_endpoint: str | None = _setting(None, "OTLP/HTTP metrics endpoint the GPU samples go to, any OpenTelemetry backend (default: SERVER/v1/metrics)", commands=GPU, metavar="URL")
    otlp_timeout_s: float = _setting(10.0, "an OTLP export gives up after this long; so does the final flush before bench_done", commands=GPU, minimum=0.1, metavar="S")
    proc_root: str = _setting(DEFAULT_PROC_ROOT, "where /proc is (host memory: meminfo); a testing seam, or a host's /proc mounted elsewhere", commands=GPU, metavar="DIR")
    cgroup_root: str = _setting(DEFAULT_CGROUP_ROOT, "where the container's cgroup tree is (memory.current, memory.max, memory.events' oom_kill; cgroup v1: memory/)", commands=GPU, metavar="DIR")
    nvml_module: str | None = _setting(None, "testing seam: import this instead of pynvml: package.module or /path/file.py, with :attribute for an object in it", commands=GPU, metavar="MODULE", hidden=True)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            minimum = f.metadata.get("minimum")
            value = getattr(self, f.name)
            if minimum is not None and value is not None and value < minimum:
                raise ConfigError(f"{_flag(f.name)}: must be >= {minimum}, got {value!r}")
        if self.spool_full_policy not in FULL_POLICIES:
            raise ConfigError(f"--spool-full-policy: expected one of {', '.join(FULL_POLICIES)}, got {self.spool_full_policy!r}")
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ConfigError(f"--log-level: expected DEBUG, INFO, WARNING or ERROR, got {self.log_level!r}")
        try:
            compile_rate_regex(self.rate_regex)
        except (re.error, ValueError) as e:
            raise ConfigError(f"--rate-regex: {e}") from e
        for name in ("instance_id", "source"):
            value = getattr(self, name)
            if value is not None:
                check_name(value, _flag(name), source=name == "source")
        seen = set()
        for source, _path in self.tails:
            if source in seen or source == self.source:
                raise ConfigError(f"--tail: source {source!r} is given twice")
            seen.add(source)
        if 0 < self.gpu_interval_s < MIN_GPU_INTERVAL_S:
            raise ConfigError(f"--gpu-interval-s: expected 0 (off) or at least {MIN_GPU_INTERVAL_S}, got {self.gpu_interval_s!r}")
        if self.otlp_endpoint is not None and not re.match(r"^https?://[^/]", self.otlp_endpoint):
            raise ConfigError(f"--otlp-endpoint: expected an http:// or https:// URL, got {self.otlp_endpoint!r}")
        if self.done_event is not None and self.done_event not in EVENT_KINDS:
            raise ConfigError(f"--done-event: expected one of {', '.join(EVENT_KINDS)}, got {self.done_event!r}")


@dataclass(frozen=True)
class Invocation:
    command: str  # run | wrap | tail | event
    settings: AgentSettings
    argv: tuple[str, ...] = ()  # the wrapped command
    event_kind: str | None = None
    event_fields: dict[str, Any] = field(default_factory=dict)


def _flag(name: str) -> str:
    return "--" + {"tails": "tail"}.get(name, name).replace("_", "-")


def _env_name(f: dataclasses.Field) -> str:
    return f.metadata["env"] or "FLEETLOG_AGENT_" + {"tails": "tail"}.get(f.name, f.name).upper()


def env_names() -> dict[str, str]:
    """Setting name -> environment variable (for the docs and their test)."""
    return {f.name: _env_name(f) for f in dataclasses.fields(AgentSettings)}


MAX_NAME_CHARS = 128  # the server's id rule (ingest/contract/codec.py check_id, check_source)


def check_name(value: str, where: str, *, source: bool = False) -> str:
    """The server's rule for an id, and for a source name also no '"' or '\\': a name the server
    would refuse on every push stops the agent at start-up instead."""
    why = None
    if not value.strip():
        why = "expected a non-empty name"
    elif len(value) > MAX_NAME_CHARS:
        why = f"must be at most {MAX_NAME_CHARS} characters"
    elif not value.isprintable():
        why = "must be printable: no control or format characters"
    elif value[0] == "-":
        why = "must not start with '-'"
    elif source and ('"' in value or "\\" in value):
        why = "must not contain '\"' or '\\'"
    if why:
        raise ConfigError(f"{where}: {why}, got {value[:60]!r}")
    return value


def _cast(name: str, raw: Any, origin: str) -> Any:
    kind = AgentSettings.__dataclass_fields__[name].type
    if not isinstance(raw, str):
        return raw
    try:
        if kind in ("int", "int | None"):
            return int(raw)
        if kind in ("float", "float | None"):
            return float(raw)
        if kind == "bool":
            lowered = raw.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if kind.startswith("tuple"):
            return tuple(parse_tail(item.strip(), origin) for item in raw.split(",") if item.strip())
    except ValueError:
        raise ConfigError(f"{origin}: expected {kind.replace(' | None', '')}, got {raw!r}") from None
    return raw


def parse_tail(item: str, origin: str = "--tail") -> tuple[str, str]:
    source, sep, path = item.partition("=")
    if not sep or not path:
        raise ConfigError(f"{origin}: expected SOURCE=PATH, got {item!r}")
    return check_name(source, origin, source=True), path


def parse_event_fields(items: list[str]) -> dict[str, Any]:
    """``key=value``: the value is JSON when it parses (numbers, true, {"a": 1}), else a string."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"event field: expected key=value, got {item!r}")
        try:
            out[key] = orjson.loads(raw)
        except orjson.JSONDecodeError:
            out[key] = raw
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleetlog-agent", description="Ship a GPU instance's logs and lifecycle to fleetlog, exactly once.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    helps = {
        "run": "wrap the benchmark: ship its output and tailed logs, then bench_done and logs_complete; exit with its code",
        "wrap": "wrap another step (source 'setup'): ship its output, then logs_complete and --done-event; exit with its code",
        "tail": "tail files until SIGTERM/SIGINT (the proving daemon's logs after the benchmark)",
        "event": "send one lifecycle event (spooled when the server cannot be reached)",
    }
    for command in COMMANDS:
        p = sub.add_parser(command, help=helps[command], description=helps[command])
        if command == "event":
            p.add_argument("event_kind", metavar="KIND", choices=EVENT_KINDS, help=", ".join(EVENT_KINDS))
            p.add_argument("event_fields", metavar="KEY=VALUE", nargs="*", help="extra fields; values are JSON when they parse")
        for f in dataclasses.fields(AgentSettings):
            if command not in f.metadata["commands"]:
                continue
            text = argparse.SUPPRESS if f.metadata["hidden"] else f"{f.metadata['help']} (env {_env_name(f)}; default {f.default!r})"
            if f.name == "tails":
                p.add_argument("--tail", dest="tails", action="append", metavar=f.metadata["metavar"], help=text)
            elif f.type == "bool":
                p.add_argument(_flag(f.name), dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=text)
            else:
                flags = [_flag(f.name)] + ([_flag(f.name)[:-2]] if f.name.endswith("_s") else [])  # --flush-timeout too
                p.add_argument(*flags, dest=f.name, default=None, metavar=f.metadata["metavar"], help=text)
        if command in WRAPPING:
            p.usage = f"fleetlog-agent {command} [OPTIONS] -- COMMAND [ARGS...]"
    return parser


def load(argv: list[str], environ: Mapping[str, str] | None = None) -> Invocation:
    environ = os.environ if environ is None else environ
    argv = list(argv)
    wrapped: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, wrapped = argv[:cut], argv[cut + 1 :]
    args = vars(build_parser().parse_args(argv))
    command = args.pop("command")
    values: dict[str, Any] = {}
    for f in dataclasses.fields(AgentSettings):
        if command not in f.metadata["commands"]:
            continue
        env = _env_name(f)
        if environ.get(env, "") != "":
            values[f.name] = _cast(f.name, environ[env], env)
        flag_value = args.get(f.name)
        if flag_value is not None:
            if f.name == "tails":
                values["tails"] = tuple(parse_tail(item) for item in flag_value)
            else:
                values[f.name] = _cast(f.name, flag_value, _flag(f.name))
    if "instance_id" not in values and environ.get("CONTAINER_ID", "").strip():
        values["instance_id"] = "C." + environ["CONTAINER_ID"].strip()
    if command == "event" and "flush_timeout_s" not in values:
        values["flush_timeout_s"] = EVENT_FLUSH_TIMEOUT_S  # an entrypoint step should not hang for minutes
    if command in WRAPPING and values.get("source") is None:
        values["source"] = "benchout" if command == "run" else "setup"
    for required, env in (("server", "FLEETLOG_SERVER"), ("instance_id", "FLEETLOG_INSTANCE_ID or CONTAINER_ID")):
        if not values.get(required):
            raise ConfigError(f"{_flag(required)}: required (or set {env})")
    if not re.match(r"^https?://", values["server"]):
        raise ConfigError(f"--server: expected an http:// or https:// URL, got {values['server']!r}")
    settings = AgentSettings(**values)
    if command in WRAPPING and not wrapped:
        raise ConfigError(f"{command}: expected the command after '--', e.g. fleetlog-agent {command} -- ./benchmark.sh 12")
    if command not in WRAPPING and wrapped:
        raise ConfigError(f"{command}: takes no command after '--'")
    if command == "tail" and not settings.tails:
        raise ConfigError("tail: expected at least one --tail SOURCE=PATH")
    kind = args.get("event_kind")
    fields = parse_event_fields(args.get("event_fields") or []) if command == "event" else {}
    return Invocation(command, settings, tuple(wrapped), kind, fields)
