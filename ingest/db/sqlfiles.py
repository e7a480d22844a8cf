"""The SQL files under ``queries/``: reading them, composing their ``-- needs:``, binding parameters.

A file may say ``-- needs: host_performance, hosts``: each named query (``queries/NAME.sql`` or a rule
``queries/policies/NN_NAME.sql``) is put in front as a CTE, its own needs first, so an engineer's
file reads like a query over tables that exist. ``$name`` parameters are DuckDB's named
parameters; ``now`` and ``min_rate`` are filled in when not given.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

from ingest.errors import QueryError

_NEEDS = re.compile(r"^--\s*needs:\s*([a-z0-9_,\s]+?)\s*$", re.MULTILINE)
_PARAM = re.compile(r"\$([a-z_][a-z0-9_]*)")


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
