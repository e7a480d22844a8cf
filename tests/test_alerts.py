"""dashboards/alerts.yml: valid for promtool, and true on the demo fleet.

The series promtool evaluates are a real server's /metrics, scraped twice (tests/fleet.py's demo
fleet, then refused pushes in between), so the rules are checked against the names, labels and values
fleetlog actually exposes, not a hand-written copy of them.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import subprocess
from dataclasses import replace
from urllib.parse import quote_plus

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from ingest.app import create_app
from ingest.web.keys import CORE
from ingest.db.sqlfiles import Rule
from tests.conftest import REPO
from tests.fleet import demo_fleet, utcnow

ALERTS = REPO / "dashboards" / "alerts.yml"
PAGE_URL = "https://fleet.example.com/fleetlog"  # the server's public_url, read back by the annotations
STEP_AT_MIN = 40  # the first scrape's values until this minute, the second's after
EVAL_AT_MIN = 45


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        message = "promtool is not installed (Debian's prometheus package ships it: apt-get install prometheus)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def test_alert_rules_pass_promtool_check():
    checked = subprocess.run([promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def samples(text: str) -> dict[str, float]:
    """fleetlog_* samples of an exposition, keyed by their PromQL series selector."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not s.name.startswith("fleetlog_") or s.name.endswith("_created"):
                continue
            labels = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


PAGE_TEMPLATE = '{{ with query "fleetlog_page_info" }}{{ . | first | label "url" }}{{ end }}'


def rendered(rule: dict, labels: dict[str, str], value: str = "") -> dict[str, str]:
    """The rule's annotations as Prometheus renders them: ``{{ $labels.x }}`` (``| urlquery``: escaped
    for a URL's query), ``{{ $value }}``, and the page's URL from the fleetlog_page_info series."""

    def one(text: str) -> str:
        text = text.replace(PAGE_TEMPLATE, PAGE_URL).replace("{{ $value }}", value)
        text = re.sub(r"\{\{ \$labels\.(\w+) \| urlquery \}\}", lambda m: quote_plus(labels[m.group(1)]), text)
        return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)

    return {k: one(v) for k, v in rule["annotations"].items()}


async def test_alert_rules_fire_on_the_demo_fleet_scraped_from_a_real_server(aiohttp_client, settings, tmp_path):
    tool = promtool()
    # a spike is one failure of a class on a GPU model within 10 minutes here: the demo fleet's fresh ones
    client = await aiohttp_client(create_app(replace(settings, policy_interval_s=0, spike_failures=1,
                                                     spike_window_s=600.0, public_url=PAGE_URL)))
    await demo_fleet(client, utcnow() - dt.timedelta(seconds=30))
    engine = client.app[CORE].policy
    engine.rules = [*engine.rules, Rule("broken", REPO / "broken.sql", "SELECT * FROM nowhere", "0", "table", ())]
    await engine.run_cycle(False)

    async def refused(n: int) -> None:  # an agent sending what the server refuses
        for _ in range(n):
            r = await client.post("/api/v1/logs", data=b'{"instance_id": "C.31", "lines": [')
            assert r.status == 400

    first = samples(await (await client.get("/metrics")).text())  # before any refusal: the series exist at 0
    await refused(16)
    second = samples(await (await client.get("/metrics")).text())
    assert set(first) <= set(second)

    def values(name: str, value: float) -> str:  # promtool's expanding notation; "_" where there was no sample
        before = f"{first[name]}x{STEP_AT_MIN - 1}" if name in first else f"_x{STEP_AT_MIN - 1}"
        return f"{before} {value}x{60 - STEP_AT_MIN}"

    series = [{"series": name, "values": values(name, value)} for name, value in sorted(second.items())]
    rules = {r["alert"]: r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]}

    def firing(alert: str, *label_sets: dict[str, str], value: str = "") -> dict:
        rule = rules[alert]
        return {"eval_time": f"{EVAL_AT_MIN}m", "alertname": alert, "exp_alerts": [
            {"exp_labels": {**labels, **rule["labels"]}, "exp_annotations": rendered(rule, labels, value)} for labels in label_sets]}

    free = second["fleetlog_storage_free_bytes{}"] / second["fleetlog_storage_size_bytes{}"]
    expected = [
        firing("FleetlogInstanceFailed", {"phase": "benchmark"}, {"phase": "params"}),  # C.32733029, C.drop, C.hung; C.params
        firing("FleetlogIncompleteLogs", {}),  # C.31 (gap), C.drop (dropped lines), C.hung
        firing("FleetlogHostsExcluded", {}),  # 55891 (oom)
        firing("FleetlogPushesRefused", {"reason": "bad_request"}),
        firing("FleetlogNoEligibleHosts"),
        firing("FleetlogDestroyFailed"),
        firing("FleetlogIngestErrors"),
        firing("FleetlogNotificationsDropped"),
        firing("FleetlogPolicyRuleFailing", {"rule": "broken"}),  # the others still ran
        # C.32733029 (oom), C.drop (unknown: exit 1, nothing matched), C.params (param_fetch), all 30 s ago; not
        # C.hung (hung 2 hours ago)
        firing("FleetlogFailureSpike", {"failure_class": "oom", "gpu_model": "RTX PRO 4000"},
               {"failure_class": "param_fetch", "gpu_model": "RTX 3090"}, {"failure_class": "unknown", "gpu_model": "RTX 4090"},
               value="1"),
        firing("FleetlogDiskNearlyFull", *([{}] if free < 0.10 else [])),
    ]
    assert set(rules) - {t["alertname"] for t in expected} == {"FleetlogDown"}  # no up{} series in a unit test
    test_file = tmp_path / "alerts_test.yml"
    test_file.write_text(yaml.safe_dump({
        "rule_files": [str(ALERTS)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": expected}],
    }, sort_keys=False))
    ran = subprocess.run([tool, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stdout + ran.stderr


async def test_every_refusal_reason_and_actuation_outcome_has_a_series_from_the_start(aiohttp_client, settings):
    """`increase()` sees no rise at a counter's first increment if its series did not exist before it,
    so the first burst of refused pushes (or the first failed destroy) would never alert: every
    reason the server can refuse with, and every outcome of a destroy, is exposed at 0 from start-up."""
    from ingest.errors import refusal_reasons

    client = await aiohttp_client(create_app(settings))
    text = await (await client.get("/metrics")).text()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    for reason in refusal_reasons() | {"unauthorized", "too_large", "bad_request", "overloaded", "internal"}:
        assert samples.get(("fleetlog_ingest_rejected_requests_total", (("reason", reason),))) == 0, reason
    for state in ("executed", "failed", "superseded", "skipped"):
        key = ("fleetlog_policy_actuations_total", (("action", "destroy"), ("state", state)))
        assert samples.get(key) == 0, key
