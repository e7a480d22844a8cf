"""Helpers of the agent's end-to-end tests: polling with a deadline, the read API, the exactly-once check."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tests" / "scripts"
FAST = [
    "--retry-initial-delay-s", "0.05",
    "--retry-max-delay-s", "0.3",
    "--poll-interval-s", "0.02",
    "--batch-max-delay-s", "0.05",
    "--flush-timeout", "30",
]


def wait_until(predicate, timeout_s: float = 20.0, interval_s: float = 0.05, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


class Api:
    """The server's read API, synchronously."""

    def __init__(self, url: str, token: str | None = None) -> None:
        self.url = url
        self.headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})

    def _call(self, path: str, body: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, headers=self.headers)
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.load(resp)

    def instance(self, instance_id: str) -> dict | None:
        try:
            return self._call(f"/api/v1/instances/{instance_id}")
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise

    def query(self, sql: str) -> list[list]:
        return self._call("/api/v1/query", {"sql": sql})["rows"]

    def lines(self, instance_id: str, source: str) -> list[tuple[str, int, str]]:
        """(run_id, seq, line) of every stored line of a source."""
        rows = self.query(f"SELECT run_id, seq, line FROM logs WHERE instance_id = '{instance_id}' AND source = '{source}' ORDER BY run_id, seq")
        return [tuple(r) for r in rows]

    def count(self, instance_id: str, source: str | None = None) -> int:
        where = f" AND source = '{source}'" if source else ""
        return self.query(f"SELECT count(*) FROM logs WHERE instance_id = '{instance_id}'{where}")[0][0]

    def events(self, instance_id: str, kind: str) -> list[dict]:
        detail = self.instance(instance_id) or {"events": []}
        return [e["body"] for e in detail["events"] if e["kind"] == kind]


def assert_exactly_once(api: Api, instance_id: str, source: str, expected: list[str]) -> None:
    """The stored lines of a source are the expected multiset, numbered 0..n-1 in each run, no repeats."""
    stored = api.lines(instance_id, source)
    assert Counter(line for _r, _s, line in stored) == Counter(expected)
    by_run: dict[str, list[int]] = {}
    for run_id, seq, _line in stored:
        by_run.setdefault(run_id, []).append(seq)
    for seqs in by_run.values():
        assert seqs == list(range(len(seqs)))
