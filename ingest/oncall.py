"""The commands on-call reaches for, over the HTTP API: ``logs``, ``instances``, ``why``, ``hosts``,
``search``, and how every command prints rows (``--format table|json|csv``).

Each takes a ``Client`` (ingest/client.py) and the parsed arguments, prints to ``out``, and returns
the exit status. Tables fit ``TABLE_WIDTH`` columns: the widest columns give way, their cells cut
with an ellipsis; ``json`` and ``csv`` always carry the whole values.
"""

from __future__ import annotations

import csv
import re
import sys
from typing import Any, Iterable, Sequence, TextIO

import orjson

from ingest.client import Client, ClientError

TABLE_WIDTH = 100
MIN_COLUMN = 6
GAP = "  "


# ---- printing rows


def short_time(value: Any) -> str:
    """An API timestamp (ISO-8601, UTC) as ``2026-11-29 11:30:58``."""
    if not isinstance(value, str) or len(value) < 19 or value[10] != "T":
        return "" if value is None else str(value)
    return value[:10] + " " + value[11:19]


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e-3 and value else f"{value:.2f}".rstrip("0").rstrip(".")
    if isinstance(value, (dict, list)):
        return orjson.dumps(value).decode()
    return str(value).replace("\r", "\\r").replace("\n", "\\n")


def fit_widths(widths: list[int], total: int = TABLE_WIDTH) -> list[int]:
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


def print_table(columns: Sequence[str], rows: Iterable[Sequence[Any]], out: TextIO, *, total: int = TABLE_WIDTH) -> None:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = fit_widths([max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)], total)
    out.write(GAP.join(_clip(c, w).ljust(w) for c, w in zip(columns, widths)).rstrip() + "\n")
    out.write(GAP.join("-" * w for w in widths) + "\n")
    for r in cells:
        out.write(GAP.join(_clip(v, w).ljust(w) for v, w in zip(r, widths)).rstrip() + "\n")
    out.write(f"({len(cells)} row{'s' if len(cells) != 1 else ''})\n")


def _csv_cell(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return orjson.dumps(value).decode()
    return value


def print_rows(columns: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str, out: TextIO = sys.stdout) -> None:
    if fmt == "json":
        out.write(orjson.dumps([dict(zip(columns, row)) for row in rows], default=str).decode() + "\n")
    elif fmt == "csv":
        writer = csv.writer(out)
        writer.writerow(columns)
        writer.writerows([[_csv_cell(v) for v in row] for row in rows])
    else:
        print_table(columns, rows, out)


def print_records(records: Sequence[dict], columns: Sequence[tuple[str, Any]], fmt: str, out: TextIO = sys.stdout) -> None:
    """``records`` as rows: in a table, the (title, getter) ``columns``; in JSON and CSV, every field."""
    if fmt == "table":
        print_table([t for t, _ in columns], [[get(r) for _, get in columns] for r in records], out)
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
    ("runs", lambda r: r.get("runs")),
    ("failed", lambda r: r.get("failed_runs")),
    ("$/proof", lambda r: r.get("dollars_per_proof")),
    ("bad", lambda r: "bad" if r.get("bad") else ""),
    ("deploy", lambda r: "eligible" if r.get("eligible") else "no"),
    ("why", lambda r: r.get("reason")),
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
    print_records(doc["hits"], SEARCH_COLUMNS, args["format"], out)
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


def why(client: Client, args: dict, out: TextIO = sys.stdout) -> int:
    """The failure banner of the page, as text: exit, class, deciding line, excerpt, completeness, decisions."""
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
    if args["format"] != "table":
        doc = {"instance_id": instance, "state": detail.get("state"), "machine_id": detail.get("machine_id"),
               "gpu_model": detail.get("gpu_model"), "bench": bench, "logs": detail.get("logs"), "decisions": decisions}
        if args["format"] == "json":
            out.write(orjson.dumps(doc, default=str).decode() + "\n")
        else:
            print_records(decisions, DECISION_COLUMNS, "csv", out)
        return 0
    w = out.write
    w(f"{instance}  state {detail.get('state')}  machine {detail.get('machine_id')}  {detail.get('gpu_model') or ''}\n".rstrip() + "\n")
    if not bench:
        w("no benchmark run reported yet\n")
    elif bench.get("done_at") is None:
        w(f"benchmark running since {short_time(bench.get('started_at'))}\n")
    elif not is_failed(bench):
        w(f"benchmark passed: exit 0, {_cell(bench.get('rate_per_hour'))} proofs/hour\n")
    else:
        w(f"Benchmark failed: exit code {bench.get('exit_code')}, class {bench.get('failure_class') or 'not classified yet'}"
          f", rate {_cell(bench.get('rate_per_hour'))}, ended {short_time(bench.get('done_at'))}\n")
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
    w("\ndecisions:\n")
    if decisions:
        print_records(decisions, DECISION_COLUMNS, "table", out)
    else:
        w("  none\n")
    return 0
