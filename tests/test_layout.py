"""The house's rules, read from the sources with ``ast`` so that they cannot rot silently:

- only ``ingest/db/`` imports duckdb or psycopg (the command's ``--db`` goes through it too);
- no SQL statement in a string outside ``ingest/db/`` (queries/ and dashboards/sql hold the rest);
- nothing swaps another object's methods or callbacks at run time (``policy.run_cycle = ...``,
  ``writer._reopen = ...``, ``slots.on_retired = ...``): what a part needs is handed to its
  constructor;
- imports run downhill: contract/ is the floor, db/ imports neither policy/ nor web/, policy/ not web/;
- at most 14 modules at the top of ``ingest/``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import REPO

INGEST = REPO / "ingest"
DATABASE_MODULES = ("duckdb", "psycopg")
SQL = re.compile(r"\bSELECT\s+[\w*(]+.*\bFROM\s|\bINSERT\s+(OR\s+\w+\s+)?INTO\b|\bDELETE\s+FROM\b|\bUPDATE\s+\w+\s+SET\b"
                 r"|\bCREATE\s+(OR\s+REPLACE\s+)?(TEMP\s+)?(TABLE|VIEW|INDEX)\b", re.S)


def sources() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(), str(p))) for p in sorted(INGEST.rglob("*.py"))]


def imported(tree: ast.Module) -> list[tuple[str, int]]:
    """(module, line) of every import, at any depth (function-level imports count too)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.module, node.lineno))
            out.extend((f"{node.module}.{alias.name}", node.lineno) for alias in node.names)
    return out


def inside(path: Path, package: str) -> bool:
    return path.is_relative_to(INGEST / package)


def test_only_the_database_package_imports_duckdb_or_psycopg():
    found = [f"{path.relative_to(REPO)}:{line} imports {name}" for path, tree in sources() if not inside(path, "db")
             for name, line in imported(tree) if name.split(".")[0] in DATABASE_MODULES]
    assert found == []


def test_no_sql_statement_outside_the_database_package():
    found = []
    for path, tree in sources():
        if inside(path, "db"):
            continue
        docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                if SQL.search(node.value):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value[:60]!r}")
    assert found == []


def _callables(tree: ast.Module) -> set[str]:
    return {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _is_callable_value(value: ast.expr, functions: set[str]) -> bool:
    """A lambda, a function of the module, a bound method (``core.reopen``: a function of ingest/ by
    that name) or a functools.partial."""
    if isinstance(value, ast.Lambda):
        return True
    if isinstance(value, ast.Name):
        return value.id in functions
    if isinstance(value, ast.Attribute):
        return value.attr in functions
    if isinstance(value, ast.Call):
        fn = value.func
        return (isinstance(fn, ast.Attribute) and fn.attr == "partial") or (isinstance(fn, ast.Name) and fn.id == "partial")
    return False


def test_nothing_swaps_another_objects_methods_or_callbacks():
    found = []
    functions = set().union(*(_callables(tree) for _path, tree in sources()))
    for path, tree in sources():
        modules = {(alias.asname or alias.name).split(".")[0] for node in ast.walk(tree)
                   if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assign):
                continue
            for target in node.targets:
                if not isinstance(target, ast.Attribute) or not isinstance(target.value, ast.Name):
                    continue
                owner = target.value.id
                if owner in ("self", "cls"):
                    continue
                where = f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(target)} = {ast.unparse(node.value)[:50]}"
                if owner in modules:
                    found.append(f"{where} (another module's attribute)")
                elif target.attr.startswith("_"):
                    found.append(f"{where} (another object's private attribute)")
                elif _is_callable_value(node.value, functions):
                    found.append(f"{where} (a method or callback swapped in)")
    assert found == []


FLOORS = {  # package -> the packages of ingest/ it must not import
    "contract": ("db", "policy", "web", "app", "core", "cli", "auth"),
    "db": ("policy", "web", "app", "core", "cli"),
    "policy": ("web", "app", "core", "cli"),
}


def test_imports_run_downhill():
    found = []
    for path, tree in sources():
        for package, forbidden in FLOORS.items():
            if not inside(path, package):
                continue
            for name, line in imported(tree):
                parts = name.split(".")
                if parts[0] == "ingest" and len(parts) > 1 and parts[1] in forbidden:
                    found.append(f"{path.relative_to(REPO)}:{line} ({package}/) imports {name}")
    assert found == []


def test_at_most_fourteen_modules_at_the_top_of_ingest():
    top = sorted(p.name for p in INGEST.glob("*.py"))
    assert len(top) <= 14, top
