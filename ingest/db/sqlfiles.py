"""The SQL files under ``queries/``, in one dialect: reading them, their ``-- field: value`` header
(``header``), composing their ``-- needs:``, binding ``$name`` parameters, and the policy rules of
``queries/policies/`` (``load_rules``: ``-- rule:``, ``-- output:``, checked read-only at start-up).

A file may say ``-- needs: host_performance, hosts``: each named query (``queries/NAME.sql`` or a rule
``queries/policies/NN_NAME.sql``) is put in front as a CTE, its own needs first, so an engineer's
file reads like a query over tables that exist. ``$name`` parameters are DuckDB's named
parameters; ``now`` and ``min_rate`` are filled in when not given.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ingest.errors import ConfigError, QueryError

_NEEDS = re.compile(r"^--\s*needs:\s*([a-z0-9_,\s]+?)\s*$", re.MULTILINE)
_PARAM = re.compile(r"\$([a-z_][a-z0-9_]*)")
_FIELD = re.compile(r"^--\s*([a-z_]+):\s*(.*)$")


def header(text: str) -> dict[str, str]:
    """The ``-- field: value`` lines of a file (the first of each field)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        m = _FIELD.match(line.strip())
        if m and m.group(1) not in fields:
            fields[m.group(1)] = m.group(2).strip()
    return fields


def find(name: str, queries_dir: Path) -> Path:
    direct = queries_dir / f"{name}.sql"
    if direct.exists():
        return direct
    rules = sorted((queries_dir / "policies").glob(f"*_{name}.sql"))
    if rules:
        return rules[0]
    raise QueryError(f"needs: no query named {name!r} in {queries_dir} or its policies/")


def compose(path: Path, queries_dir: Path) -> str:
    """The file's SQL with everything it needs in front, as CTEs."""
    ctes: dict[str, str] = {}

    def gather(p: Path, stack: tuple[str, ...]) -> str:
        text = p.read_text()
        for match in _NEEDS.finditer(text):
            for name in filter(None, (n.strip() for n in match.group(1).split(","))):
                if name in stack:
                    raise QueryError(f"{p.name}: needs {name!r} in a cycle")
                if name not in ctes:
                    ctes[name] = gather(find(name, queries_dir), stack + (name,))
        return text.strip().rstrip(";")

    body = gather(Path(path), (Path(path).stem,))
    if not ctes:
        return body
    prefix = ",\n".join(f'"{name}" AS (\n{sql}\n)' for name, sql in ctes.items())
    return f"WITH {prefix}\nSELECT * FROM (\n{body}\n)"


def bind(sql: str, given: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The named parameters ``sql`` uses, from ``given`` then ``defaults``; a missing one is an error."""
    used = set(_PARAM.findall(sql))
    unknown = set(given) - used
    if unknown:
        raise QueryError(f"params: {sorted(unknown)} not used by the query (it uses {sorted(used) or 'none'})")
    params = {}
    for name in sorted(used):
        if name in given:
            params[name] = given[name]
        elif name in defaults:
            params[name] = defaults[name]
        else:
            raise QueryError(f"params: the query needs ${name}; give it (e.g. --param {name}=...)")
    return params


_HEADER = re.compile(r"^--\s?(.*)$")


def describe(path: Path, queries_dir: Path) -> dict[str, Any]:
    """A canned question for the page: its name, what it answers (the opening comment, up to the
    ``params:`` line), the parameters it takes, and its SQL with what it needs in front."""
    path = Path(path)
    about: list[str] = []
    for line in path.read_text().splitlines():
        match = _HEADER.match(line)
        if not match or match.group(1).lstrip().startswith(("params:", "needs:")):
            break
        about.append(match.group(1).strip())
    text = " ".join(about)
    prefix = f"{path.stem}:"
    sql = compose(path, queries_dir)
    return {
        "name": path.stem,
        "description": text[len(prefix):].strip() if text.startswith(prefix) else text,
        "params": sorted(set(_PARAM.findall(sql))),
        "sql": sql,
    }


def catalogue(queries_dir: Path) -> list[dict[str, Any]]:
    """Every canned question of ``queries_dir`` (not the rules of policies/), by name."""
    return [describe(p, queries_dir) for p in sorted(Path(queries_dir).glob("*.sql"))]


# -- the policy rules (queries/policies/) ---------------------------------------------------------
OUTPUTS = {"classify", "table", "decisions"}
PARAM_NAMES = {"min_rate", "destroy_grace_s", "bad_host_ttl_s", "stale_ttl_s", "retention_s", "exclude_repeats", "now",
               "public_url", "degrade_action"}


@dataclass(frozen=True)
class Rule:
    name: str
    path: Path
    sql: str
    sha: str
    output: str
    params: tuple[str, ...]


def load_rules(queries_dir: str | Path) -> list[Rule]:
    """Read and check every ``queries/policies/*.sql``; a broken rule raises ConfigError naming its file."""
    # imported here: the read-only check needs duckdb, and the operator's ``fleetlog query`` reads
    # these files on an agent-only install (no server extra) to send them to a server
    from ingest.db.usersql import check_select

    directory = Path(queries_dir) / "policies"
    if not directory.is_dir():
        raise ConfigError(f"queries_dir: {directory} is not a directory")
    rules = []
    for path in sorted(directory.glob("*.sql")):
        text = path.read_text()
        fields = header(text)
        name = fields.get("rule") or path.stem.split("_", 1)[-1]
        output = fields.get("output", "").split(" ", 1)[0]
        if output not in OUTPUTS:
            raise ConfigError(f"{path}: '-- output:' must start with one of {sorted(OUTPUTS)}")
        sql = text.strip().rstrip(";")
        params = tuple(sorted(set(_PARAM.findall(sql))))
        unknown = set(params) - PARAM_NAMES
        if unknown:
            raise ConfigError(f"{path}: unknown parameters {sorted(unknown)}; known: {sorted(PARAM_NAMES)}")
        try:
            check_select(sql)
        except QueryError as e:
            raise ConfigError(f"{path}: {e.message}") from e
        rules.append(Rule(name, path, sql, hashlib.sha256(sql.encode()).hexdigest()[:16], output, params))
    return rules
