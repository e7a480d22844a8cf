"""The commands on-call reaches for, over the HTTP API: ``logs``, ``instances``, ``why``, ``hosts``,
``search``, and how every command prints rows (``--format table|json|csv``).

Each takes a ``Client`` (ingest/client.py) and the parsed arguments, prints to ``out``, and returns
the exit status. Tables fit the terminal (``terminal_width``: ``COLUMNS``, the TTY, else
``TABLE_WIDTH``): the widest columns give way, their cells cut with an ellipsis, except a column
printed whole (a log line: the one field on-call needs is never cut). A result too wide for the
terminal is shown one field a line (``print_expanded``, psql's expanded mode); ``json`` and ``csv``
always carry the whole values. Numbers keep ``SIGNIFICANT`` digits, so that rows compare.
"""

from __future__ import annotations

import csv
import math
import re
import shutil
import sys
from typing import Any, Iterable, Sequence, TextIO

import orjson

from ingest.client import Client, ClientError

TABLE_WIDTH = 100  # when the width of the terminal is not known (output to a pipe or a file, no COLUMNS)
MIN_COLUMN = 6
GAP = "  "
SIGNIFICANT = 4  # digits of a float: $/proof 0.009524 and 0.01013 stay apart, a rate 12.4 stays 12.4


def terminal_width() -> int:
    """``COLUMNS`` when set, else the terminal's width, else ``TABLE_WIDTH``."""
    return shutil.get_terminal_size((TABLE_WIDTH, 24)).columns or TABLE_WIDTH


# ---- printing rows


def short_time(value: Any) -> str:
    """An API timestamp (ISO-8601, UTC) as ``2026-11-29 11:30:58``."""
    if not isinstance(value, str) or len(value) < 19 or value[10] != "T":
        return "" if value is None else str(value)
    return value[:10] + " " + value[11:19]


def number(value: float) -> str:
    """``SIGNIFICANT`` significant digits, never in exponent form, trailing zeros dropped:
    0.009524, 0.01013, 12.4, 44.1, 1235, 123457."""
    if not math.isfinite(value) or value == 0:
        return "0" if value == 0 else str(value)
    decimals = max(0, SIGNIFICANT - 1 - math.floor(math.log10(abs(value))))
    text = f"{value:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return number(value)
    if isinstance(value, (dict, list)):
        return orjson.dumps(value).decode()
    return str(value)


def _cell(value: Any) -> str:
    return _text(value).replace("\r", "\\r").replace("\n", "\\n")


def fit_widths(widths: list[int], total: int) -> list[int]:
    """Narrow the widest columns, one character at a time, until the row fits ``total``."""
    widths = list(widths)
    while sum(widths) + len(GAP) * (len(widths) - 1) > total:
        i = max(range(len(widths)), key=lambda k: widths[k])
        if widths[i] <= MIN_COLUMN:
            break
        widths[i] -= 1
    return widths


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def _natural_widths(columns: Sequence[str], cells: list[list[str]]) -> list[int]:
    return [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]


def _row_count(n: int) -> str:
    return f"({n} row{'s' if n != 1 else ''})\n"


def print_table(columns: Sequence[str], rows: Iterable[Sequence[Any]], out: TextIO, *, total: int | None = None,
                whole_last: bool = False) -> None:
    """Fit ``total`` columns (default the terminal's width); ``whole_last``: the last column is never
    cut (the others give way to leave it at least a third of the width; a longer value wraps)."""
    total = terminal_width() if total is None else total
    cells = [[_cell(v) for v in row] for row in rows]
    natural = _natural_widths(columns, cells)
    if whole_last and columns:
        rest = fit_widths(natural[:-1], max(0, total - len(GAP) - max(total // 3, len(columns[-1]))))
        widths = rest + [natural[-1]]
    else:
        widths = fit_widths(natural, total)
    clip = (widths[:-1] + [None if whole_last else widths[-1]]) if widths else []
    out.write(GAP.join(_clip(c, w).ljust(w) for c, w in zip(columns, widths)).rstrip() + "\n")
    out.write(GAP.join("-" * min(w, total) for w in widths) + "\n")
    for r in cells:
        out.write(GAP.join((v if c is None else _clip(v, c)).ljust(w) for v, w, c in zip(r, widths, clip)).rstrip() + "\n")
    out.write(_row_count(len(cells)))


def print_expanded(columns: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO, *, total: int | None = None) -> None:
    """One field a line, a record after another (psql's expanded mode, ``\\x``): the whole value, its
    own lines under each other."""
    total = terminal_width() if total is None else total
    key_width = max((len(c) for c in columns), default=0)
    for n, row in enumerate(rows, 1):
        values = [_text(v).replace("\r", "\\r").split("\n") for v in row]
        value_width = max((len(part) for lines in values for part in lines), default=0)
        head = f"-[ RECORD {n} ]"
        out.write(head + "-" * max(0, key_width + 1 - len(head)) + "+"
                  + "-" * max(1, min(value_width + 1, total - max(len(head), key_width + 1) - 1)) + "\n")
        for column, lines in zip(columns, values):
            out.write(f"{column.ljust(key_width)} | {lines[0]}".rstrip() + "\n")
            for more in lines[1:]:
                out.write(f"{'':<{key_width}} | {more}".rstrip() + "\n")
    out.write(_row_count(len(rows)))


def fits(columns: Sequence[str], rows: Sequence[Sequence[Any]], total: int | None = None) -> bool:
    """Whether the table of these rows fits ``total`` columns with no cell cut."""
    total = terminal_width() if total is None else total
    widths = _natural_widths(columns, [[_cell(v) for v in row] for row in rows])
    return sum(widths) + len(GAP) * max(0, len(widths) - 1) <= total


def _csv_cell(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return orjson.dumps(value).decode()
    return value


def print_rows(columns: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str, out: TextIO = sys.stdout, *,
               expanded: bool | None = False) -> None:
    """``expanded`` (tables only): True one field a line, None (auto) when the table does not fit the terminal."""
    if fmt == "table" and (expanded or (expanded is None and rows and not fits(columns, rows))):
        print_expanded(columns, rows, out)
    elif fmt == "json":
        out.write(orjson.dumps([dict(zip(columns, row)) for row in rows], default=str).decode() + "\n")
    elif fmt == "csv":
        writer = csv.writer(out)
        writer.writerow(columns)
        writer.writerows([[_csv_cell(v) for v in row] for row in rows])
    else:
        print_table(columns, rows, out)


def print_records(records: Sequence[dict], columns: Sequence[tuple[str, Any]], fmt: str, out: TextIO = sys.stdout, *,
                  whole_last: bool = False) -> None:
    """``records`` as rows: in a table, the (title, getter) ``columns`` (``whole_last``: the last one
    never cut); in JSON and CSV, every field."""
    if fmt == "table":
        print_table([t for t, _ in columns], [[get(r) for _, get in columns] for r in records], out, whole_last=whole_last)
        return
    names = list(dict.fromkeys(k for r in records for k in r)) if records else [t for t, _ in columns]
    print_rows(names, [[r.get(k) for k in names] for r in records], fmt, out)


# ---- the commands


def _line_text(line: dict) -> str:
    return f"{short_time(line['ts'])}  {line['source']}  {line['line']}"


def _emit_lines(lines: Iterable[dict], fmt: str, out: TextIO, header: bool) -> None:
    if fmt == "json":
        for line in lines:
            out.write(orjson.dumps(line).decode() + "\n")
    elif fmt == "csv":
        writer = csv.writer(out)
        if header:
            writer.writerow(["ts", "source", "run_id", "seq", "line"])
        for line in lines:
            writer.writerow([line["ts"], line["source"], line["run_id"], line["seq"], line["line"]])
    else:
        for line in lines:
            out.write(_line_text(line) + "\n")
    out.flush()


def logs(client: Client, args: dict, out: TextIO = sys.stdout) -> int:
    """An instance's lines, oldest first: the last ``--tail``, those matching ``--grep``, then (``--follow``) new ones."""
    instance, source, tail, fmt = args["instance"], args["source"], args["tail"], args["format"]
    if args["follow"] and not source:
        detail = client.get(f"/api/v1/instances/{_quote(instance)}")
        sources = ", ".join(sorted(detail.get("logs", {}))) or "none yet"
        print(f"fleetlog logs: --follow needs --source (this instance has: {sources})", file=sys.stderr)
        return 2
    pattern = None
    if args["grep"]:
        try:
            pattern = re.compile(args["grep"], re.IGNORECASE)
        except re.error as e:
            print(f"fleetlog logs: --grep: not a valid regular expression: {e}", file=sys.stderr)
            return 2
        # the server finds them (RE2, across the whole history of the instance), newest first
        doc = client.get("/api/v1/search", q=args["grep"], regex=1, instance=instance, source=source, since="0",
                         limit=min(tail, 1000))
        lines = doc["hits"][::-1]
        for line in lines:
            line.setdefault("source", source)
    else:
        lines = client.get(f"/api/v1/instances/{_quote(instance)}/logs", source=source, tail=tail)["lines"]
    if not lines and not args["follow"] and not _known(client, instance):
        print(f"fleetlog logs: instance {instance!r} is not known", file=sys.stderr)
        return 1
    _emit_lines(lines, fmt, out, header=True)
    if not args["follow"]:
        return 0
    last = max(((l["run_id"], l["seq"]) for l in lines), default=None)
    path = f"/api/v1/instances/{_quote(instance)}/logs"
    while True:  # the server ends a follow after 10 minutes: carry on from the last line
        params = {"source": source, "follow": 1, "tail": 0 if last is None else 10_000}
        if last is not None:
            params.update(run_id=last[0], after_seq=last[1])
        for line in client.stream(path, timeout_s=3600, **params):
            if last is not None and (line["run_id"], line["seq"]) <= last:
                continue  # already printed (a guard across reconnects; the server starts after after_seq)
            last = (line["run_id"], line["seq"])
            if pattern is None or pattern.search(line["line"]):
                _emit_lines([line], fmt, out, header=False)


def _known(client: Client, instance: str) -> bool:
    try:
        client.get(f"/api/v1/instances/{_quote(instance)}")
    except ClientError as e:
        if e.status == 404:
            return False
        raise
    return True


def _quote(value: str) -> str:
    import urllib.parse

    return urllib.parse.quote(value, safe="")


def is_failed(row: dict) -> bool:
    """What the destroy rule takes (the server's ``failing``: a failed fetch, a failed or hung run, a
    run below min_rate), or a non-zero exit or a class from an older server that does not say."""
    if "failing" in row:
        return bool(row["failing"])
    return (row.get("exit_code") not in (None, 0)) or bool(row.get("failure_class"))


def _logs_cell(row: dict) -> str:
    summary = row.get("logs") or {}
    if not summary.get("sources"):
        return "none"
    incomplete = summary.get("incomplete") or []
    return "complete" if not incomplete else f"{len(incomplete)}/{summary['sources']} incomplete"


INSTANCE_COLUMNS = [
    ("instance", lambda r: r["instance_id"]),
    ("state", lambda r: r["state"]),
    ("machine", lambda r: r["machine_id"]),
    ("gpu", lambda r: r["gpu_model"]),
    ("rate", lambda r: r["rate_per_hour"]),
    ("exit", lambda r: r["exit_code"]),
    ("class", lambda r: r["failure_class"]),
    ("logs", _logs_cell),
    ("last seen", lambda r: short_time(r["last_seen"])),
]


def instances(client: Client, args: dict, out: TextIO = sys.stdout) -> int:
    rows = client.get("/api/v1/instances", state=args["state"])["instances"]
    if args["failed"]:
        rows = [r for r in rows if is_failed(r)]
    print_records(rows, INSTANCE_COLUMNS, args["format"], out)
    return 0


HOST_COLUMNS = [
    ("machine", lambda r: r["machine_id"]),
    ("gpu", lambda r: r.get("gpu_model")),
    ("best rate", lambda r: r.get("best_rate")),
    ("recent", lambda r: r.get("recent_rate")),  # host_degradation: the mean of the last degrade_recent_runs
    ("runs", lambda r: r.get("runs")),
    ("failed", lambda r: r.get("failed_runs")),
    ("$/proof", lambda r: r.get("dollars_per_proof")),
    ("bad", lambda r: "bad" if r.get("bad") else "degraded" if r.get("degraded") else ""),
    ("deploy", lambda r: "eligible" if r.get("eligible") else "no"),
    ("why", lambda r: r.get("reason") or r.get("degradation")),  # why not eligible, else why degraded
]


def hosts(client: Client, args: dict, out: TextIO = sys.stdout) -> int:
    print_records(client.get("/api/v1/hosts")["hosts"], HOST_COLUMNS, args["format"], out)
    return 0


SEARCH_COLUMNS = [
    ("ts", lambda r: short_time(r["ts"])),
    ("instance", lambda r: r["instance_id"]),
    ("source", lambda r: r["source"]),
    ("seq", lambda r: r["seq"]),
    ("line", lambda r: r["line"]),
]


def search(client: Client, args: dict, out: TextIO = sys.stdout) -> int:
    doc = client.get("/api/v1/search", q=args["text"], regex=1 if args["regex"] else None, since=args["since"],
                     until=args["until"], source=args["source"], instance=args["instance"], limit=args["limit"])
    print_records(doc["hits"], SEARCH_COLUMNS, args["format"], out, whole_last=True)
    if doc["truncated"] and args["format"] == "table":
        out.write(f"(more than {len(doc['hits'])} matched: narrow with --since, --instance, --source or raise --limit)\n")
    return 0


DECISION_COLUMNS = [
    ("id", lambda r: r["id"]),
    ("action", lambda r: r["action"]),
    ("subject", lambda r: r["subject"]),
    ("state", lambda r: r["state"]),
    ("rule", lambda r: r["rule"]),
    ("reason", lambda r: r["reason"]),
]


def _why_failed(client: Client, instance: str) -> dict:
    """The latest run's row of queries/why_failed.sql (the server's copy; GPU in the last minute, outcome),
    or {} when the server has no such question or refuses the SQL API."""
    try:
        found = {q["name"]: q for q in client.get("/api/v1/queries")["queries"]}
        if "why_failed" not in found:
            return {}
        doc = orjson.loads(client.request("POST", "/api/v1/query", params={"format": "json"}, body=orjson.dumps(
            {"sql": found["why_failed"]["sql"], "params": {"instance_id": instance}})))
    except ClientError:
        return {}
    return dict(zip(doc["columns"], doc["rows"][-1])) if doc["rows"] else {}


def _outcome_line(bench: dict, outcome: str | None) -> str:
    """What became of the latest run, by the server's ``outcome`` (bench_outcomes) when it has one."""
    rate = bench.get("rate_per_hour")
    rate_text = f"{_cell(rate)} proofs/hour" if rate else "rate not measured"
    if bench.get("proofs_ok") is not None:  # the agent's count of completed proofs: "5 of 12 proofs"
        rate_text = f"{bench['proofs_ok']} of {bench.get('proofs') if bench.get('proofs') is not None else '?'} proofs, " + rate_text
    ended = f", ended {short_time(bench.get('done_at'))}" if bench.get("done_at") else ""
    if outcome is None:
        outcome = "running" if bench.get("done_at") is None else "failed" if is_failed(bench) else "passed"
    if outcome == "running":
        return f"benchmark running since {short_time(bench.get('started_at'))}"
    if outcome == "passed":
        return f"benchmark passed: exit 0, {rate_text}{ended}"
    if outcome == "below_min_rate":
        return f"Benchmark below min_rate: exit {bench.get('exit_code')}, {rate_text}{ended}"
    if outcome == "params_failed":
        return "Parameter fetch failed: the benchmark never ran"
    return (f"Benchmark {'hung' if outcome == 'hung' else 'failed'}: exit code {bench.get('exit_code')}, class "
            f"{bench.get('failure_class') or 'not classified yet'}, {rate_text}{ended}")


def _gpu_lines(events: list[dict], last_minute: Any) -> list[str]:
    """The GPU's state (the latest ``gpu_state`` per GPU) and each metric's mean and max over the last minute."""
    states: dict[str, dict] = {}
    for event in events:
        if event.get("kind") == "gpu_state":
            body = event.get("body") or {}
            states[str(body.get("gpu", ""))] = {**body, "ts": event.get("ts")}
    if not states:
        head = "GPU: no gpu_state reported"
    else:
        head = "GPU: " + "; ".join(
            f"{'gpu ' + gpu + ' ' if gpu else ''}state {b.get('state')}{' (' + str(b['reason']) + ')' if b.get('reason') else ''}"
            f" since {short_time(b.get('ts'))}" for gpu, b in sorted(states.items()))
    metrics = orjson.loads(last_minute) if isinstance(last_minute, str) else (last_minute or {})
    if not metrics:
        return [head, "  no GPU samples in the last minute before the end"]
    width = max(len(name) for name in metrics)
    return [head, "  the last minute before the end:"] + [
        f"    {name:<{width}}  mean {_cell(m.get('mean'))}  max {_cell(m.get('max'))}  ({m.get('samples')} samples)"
        for name, m in sorted(metrics.items())]


def _decision_line(d: dict) -> str:
    error = f"; {d['last_error']}" if d.get("last_error") and d.get("state") != "executed" else ""
    return f"decision: {d['action']} {d['subject']} {d['state']} (#{d['id']} {d['rule']}: {d['reason']}{error})"


def why(client: Client, args: dict, out: TextIO = sys.stdout) -> int:
    """The failure banner of the page, as text: outcome, the decisions on it (proposed, executed,
    superseded...), the GPU's state, then the deciding line, excerpt and log completeness."""
    instance = args["instance"]
    try:
        detail = client.get(f"/api/v1/instances/{_quote(instance)}")
    except ClientError as e:
        if e.status == 404:
            print(f"fleetlog why: instance {instance!r} is not known", file=sys.stderr)
            return 1
        raise
    decisions = client.get("/api/v1/decisions", subject=instance)["decisions"]
    if detail.get("machine_id") is not None:
        decisions += client.get("/api/v1/decisions", subject=str(detail["machine_id"]))["decisions"]
    bench = detail.get("bench") or {}
    row = _why_failed(client, instance) if bench else {}
    outcome = detail.get("outcome") or row.get("outcome")
    if args["format"] != "table":
        doc = {"instance_id": instance, "state": detail.get("state"), "machine_id": detail.get("machine_id"),
               "gpu_model": detail.get("gpu_model"), "outcome": outcome, "bench": bench,
               "gpu_state": [e["body"] for e in detail.get("events", []) if e.get("kind") == "gpu_state"],
               "gpu_last_minute": row.get("gpu_last_minute"), "logs": detail.get("logs"), "decisions": decisions}
        if args.get("diff"):  # queries/run_diff.sql's rows (migration 017)
            doc["diff"] = why_diff(client, instance)[0]
        if args["format"] == "json":
            if isinstance(doc["gpu_last_minute"], str):
                doc["gpu_last_minute"] = orjson.loads(doc["gpu_last_minute"])
            out.write(orjson.dumps(doc, default=str).decode() + "\n")
        else:
            print_records(decisions, DECISION_COLUMNS, "csv", out)
        return 0
    w = out.write
    w(f"{instance}  state {detail.get('state')}  machine {detail.get('machine_id')}  {detail.get('gpu_model') or ''}".rstrip() + "\n")
    w((_outcome_line(bench, outcome) if bench else "no benchmark run reported yet") + "\n")
    if row.get("failure_cost_usd") is not None:  # the failure_costs view (migration 015)
        w(f"this failure cost ${row['failure_cost_usd']:.2f} (dph x hours from the instance's start to the failure)\n")
    for d in decisions:
        w(_decision_line(d) + "\n")
    if not decisions:
        w("decision: none\n")
    if bench:
        w("\n" + "\n".join(_gpu_lines(detail.get("events", []), row.get("gpu_last_minute"))) + "\n")
    if bench.get("failure_line"):
        w(f"\ndeciding line:\n  {bench['failure_line']}\n")
    if bench.get("failure_excerpt"):
        w("\nexcerpt:\n" + "".join(f"  {line}\n" for line in str(bench["failure_excerpt"]).splitlines()))
    w("\nlogs:\n")
    logs_doc = detail.get("logs") or {}
    if not logs_doc:
        w("  none stored\n")
    for source, entry in sorted(logs_doc.items()):
        declared = entry.get("declared_last_seq")
        state = "complete" if entry.get("complete") else (
            "no logs_complete declared" if declared is None else f"INCOMPLETE: declared up to {declared}, gaps {entry.get('gaps')}")
        w(f"  {source:<14} run {entry.get('run_id')}  {entry.get('lines')} lines  {state}\n")
    if args.get("diff"):  # against the latest healthy run of the same GPU model (migration 017)
        w("\n" + "\n".join(why_diff(client, instance)[1]) + "\n")
    return 0


# ---- failure patterns (migration 017): `fleetlog patterns [ID]`, `fleetlog why ID --diff`


def _canned(client: Client, name: str, params: dict | None = None) -> list[dict] | None:
    """The rows of the server's copy of queries/NAME.sql, as dicts; None when the server has no such
    question (an older server)."""
    found = {q["name"]: q for q in client.get("/api/v1/queries")["queries"]}
    if name not in found:
        return None
    body = {"sql": found[name]["sql"], "params": params} if params else {"sql": found[name]["sql"]}
    doc = orjson.loads(client.request("POST", "/api/v1/query", params={"format": "json"}, body=orjson.dumps(body)))
    return [dict(zip(doc["columns"], row)) for row in doc["rows"]]


def _joined(values: Any) -> str:
    return " ".join(str(v) for v in values) if values else ""


def _pattern_block(r: dict) -> str:
    """One pattern of queries/patterns.sql as a few lines: the template whole, then who shares it."""
    n = lambda k, what: f"{r[k]} {what}{'s' if r[k] != 1 else ''}"  # noqa: E731
    facts = [("machines", _joined(r["machine_ids"])), ("GPUs", ", ".join(r["gpu_models"] or [])),
             ("drivers", _joined(r["drivers"]) or "unknown"), ("images", _joined(r["images"]) or "unknown"),
             ("e.g.", f"{r['example_instance_id']}: {r['example_line']}")]
    return (f"{r['pattern_id']}  {_joined(r['failure_classes']) or 'unclassified'}  {n('failures', 'failure')}, "
            f"{n('instances', 'instance')}, {n('machines', 'machine')}  last {short_time(r['last_failed_at'])}\n"
            f"  {r['pattern']}\n" + "".join(f"  {k:<9} {v}\n" for k, v in facts))


PATTERN_FAILURE_COLUMNS = [
    ("instance", lambda r: r["instance_id"]),
    ("machine", lambda r: r["machine_id"]),
    ("gpu", lambda r: r["gpu_model"]),
    ("driver", lambda r: r["driver"]),
    ("image", lambda r: r["image_version"]),
    ("class", lambda r: r["failure_class"]),
    ("failed at", lambda r: short_time(r["failed_at"])),
    ("line", lambda r: r["failure_line"]),
]


def patterns(client: Client, args: dict, out: TextIO = sys.stdout) -> int:
    """The fleet's failures by the template of their deciding line (queries/patterns.sql), the most
    widespread first; with a pattern id, the failures that share it (queries/pattern_failures.sql)."""
    pattern = args.get("pattern")
    name, params = ("pattern_failures", {"pattern_id": pattern}) if pattern else ("patterns", None)
    found = _canned(client, name, params)
    if found is None:
        print(f"fleetlog patterns: the server has no {name} query (an older server)", file=sys.stderr)
        return 1
    if pattern and not found:
        print(f"fleetlog patterns: no failure has pattern {pattern!r}", file=sys.stderr)
        return 1
    if pattern and args["format"] == "table":
        out.write(f"pattern {pattern}: {found[0]['pattern']}\n"
                  f"{len(found)} failure{'s' if len(found) != 1 else ''} on "
                  f"{len({r['machine_id'] for r in found})} machine(s)\n\n")
    if not pattern and args["format"] == "table":
        out.write("\n".join(_pattern_block(r) for r in found) or "no failure with a deciding line yet\n")
        out.write(f"({len(found)} pattern{'s' if len(found) != 1 else ''}; `fleetlog patterns ID` lists one's failures)\n")
        return 0
    print_records(found, PATTERN_FAILURE_COLUMNS, args["format"], out, whole_last=True)
    return 0


def _diff_lines(rows: list[dict], instance: str) -> list[str]:
    """queries/run_diff.sql's rows as text: per source, where the two runs part, both sides' lines."""
    if not rows:
        return [f"compared with: nothing (the latest run of {instance} did not fail)"]
    head = rows[0]
    if head.get("healthy_instance_id") is None:
        return [f"compared with: nothing (no run of {head.get('gpu_model') or 'its GPU model'} passed on another instance)"]
    lines = [f"compared with {head['healthy_instance_id']}: the latest healthy run of {head.get('gpu_model')} "
             f"(machine {head.get('healthy_machine_id')}, ended {short_time(head.get('healthy_done_at'))})"]
    by_source: dict[str, list[dict]] = {}
    for row in rows:
        if row.get("source") is not None:
            by_source.setdefault(row["source"], []).append(row)
    if not by_source:
        lines.append("  no log lines in either run")
    for source, parted in sorted(by_source.items()):
        first = parted[0]
        if first.get("parted_at") is None:
            lines.append(f"  {source}: alike throughout ({first.get('failed_lines')} lines)")
            continue
        alike = first["parted_at"] - 1
        lines.append(f"  {source}: alike for {alike} line{'s' if alike != 1 else ''}, parted at line {first['parted_at']} "
                     f"(failed run {first.get('failed_lines')} lines, healthy run {first.get('healthy_lines')})")
        for row in parted:
            if row.get("line_no") is None:
                continue
            no = str(row["line_no"])
            lines.append(f"    {no} + failed   {row['failed_line'] if row.get('failed_line') is not None else '(no more lines)'}")
            lines.append(f"    {' ' * len(no)} - healthy  {row['healthy_line'] if row.get('healthy_line') is not None else '(no more lines)'}")
    return lines


def why_diff(client: Client, instance: str) -> tuple[list[dict] | None, list[str]]:
    """``why --diff``: the rows of queries/run_diff.sql for the instance, and them as text."""
    rows = _canned(client, "run_diff", {"instance_id": instance})
    if rows is None:
        return None, ["compared with: the server has no run_diff query (an older server)"]
    return rows, _diff_lines(rows, instance)
