"""Fleet gauges on /metrics, read from the database at scrape time (prometheus-client Collector).

So that Grafana can draw the fleet through Prometheus: instances by state, best benchmark rate per
machine, bad and eligible machines, failed runs by class, instances with incomplete logs, decisions
by action and state. Each scrape runs a few small queries on a cursor of the Reader (``ingest/reader.py``),
with a deadline.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Iterable

import orjson

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ingest import reads
from ingest.policy import utcnow
from ingest.streams import StreamIndex

if TYPE_CHECKING:
    from ingest.reader import Reader

logger = logging.getLogger(__name__)

INSTANCES_BY_STATE = "SELECT coalesce(s.state, 'unknown'), count(*) FROM instances i LEFT JOIN instance_state s USING (instance_id) GROUP BY 1"
FAILED_BY_CLASS = """SELECT coalesce(failure_class, 'unclassified'), count(*) FROM bench_runs
                     WHERE done_at IS NOT NULL AND (exit_code IS DISTINCT FROM 0 OR coalesce(rate_per_hour, 0) <= 0) GROUP BY 1"""
DECISIONS = "SELECT action, state, count(*) FROM decisions GROUP BY 1, 2"
# benchmarked instances without a logs_complete event
UNDECLARED = """SELECT DISTINCT b.instance_id FROM bench_runs b WHERE b.done_at IS NOT NULL AND NOT EXISTS
                (SELECT 1 FROM events e WHERE e.instance_id = b.instance_id AND e.kind = 'logs_complete')"""


class FleetCollector(Collector):
    def __init__(self, reader: "Reader", index: StreamIndex, hosts_sql: str, min_rate: float,
                 timeout_s: float) -> None:
        self.reader = reader
        self.index = index
        self.hosts_sql = hosts_sql
        self.min_rate = min_rate
        self.timeout_s = timeout_s

    def collect(self) -> Iterable[Metric]:
        try:
            yield from self._collect()
        except Exception:  # a scrape must not fail because the fleet query did
            logger.exception("fleet gauges unavailable for this scrape")

    def _collect(self) -> Iterable[Metric]:
        with reads.deadline_cursor(self.reader, self.timeout_s) as cur:
            by_state = cur.execute(INSTANCES_BY_STATE).fetchall()
            failed = cur.execute(FAILED_BY_CLASS).fetchall()
            decisions = cur.execute(DECISIONS).fetchall()
            undeclared = {row[0] for row in cur.execute(UNDECLARED).fetchall()}
        hosts = reads.hosts(self.reader, self.timeout_s, self.hosts_sql, self.min_rate, utcnow())

        g = GaugeMetricFamily("fleetlog_fleet_instances", "Instances by lifecycle state", labels=["state"])
        for state, n in by_state:
            g.add_metric([state], n)
        yield g
        yield _per_machine(hosts, "best_rate", "fleetlog_fleet_best_rate_proofs_per_hour", "Best benchmark rate per machine")
        yield _per_machine(hosts, "dollars_per_proof", "fleetlog_fleet_dollars_per_proof",
                           "Rental price per proof at the best rate, per machine")
        yield GaugeMetricFamily("fleetlog_fleet_bad_hosts", "Machines excluded (by rule or operator)",
                                value=sum(1 for h in hosts if h["bad"]))
        yield GaugeMetricFamily("fleetlog_fleet_eligible_hosts", "Machines an orchestrator may rent",
                                value=sum(1 for h in hosts if h["eligible"]))
        yield GaugeMetricFamily("fleetlog_fleet_min_rate_proofs_per_hour", "The min_rate the policies apply",
                                value=self.min_rate)
        g = GaugeMetricFamily("fleetlog_fleet_failed_bench_runs", "Failed benchmark runs by failure class",
                              labels=["failure_class"])
        for failure_class, n in failed:
            g.add_metric([failure_class], n)
        yield g
        with_gaps = {i for i in self.index.instances() if any(s.gaps for s in self.index.summaries(i))}
        yield GaugeMetricFamily("fleetlog_fleet_incomplete_log_instances",
                                "Instances with a gap in a log stream, or benchmarked without logs_complete",
                                value=len(with_gaps | undeclared))
        g = GaugeMetricFamily("fleetlog_policy_decisions", "Decisions by action and state", labels=["action", "state"])
        for action, state, n in decisions:
            g.add_metric([action, state], n)
        yield g


def _per_machine(hosts: list[dict], field: str, name: str, help_text: str) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, help_text, labels=["machine_id", "gpu_model"])
    for h in hosts:
        if h[field] is not None:
            g.add_metric([str(h["machine_id"]), h["gpu_model"] or ""], h[field])
    return g


GPU_LATEST = r"""
SELECT m.instance_id, i.machine_id, m.name, m.labels, arg_max(m.value, m.ts) AS value
FROM metrics m
LEFT JOIN instances i USING (instance_id)
LEFT JOIN instance_state s USING (instance_id)
WHERE m.received_at >= now()::TIMESTAMP - to_seconds(?::DOUBLE)
  AND m.name LIKE 'DCGM\_FI\_%' ESCAPE '\'
  AND coalesce(s.state, '') <> 'killed'
GROUP BY ALL
"""
_LABEL_OK = re.compile(r"[^a-zA-Z0-9_]")


class GpuCollector(Collector):
    """The latest value of every GPU metric (DCGM-exporter names) per instance and GPU, from the
    samples received in the last ``window_s``; a killed or silent instance drops out."""

    def __init__(self, reader: "Reader", window_s: float, timeout_s: float) -> None:
        self.reader = reader
        self.window_s = window_s
        self.timeout_s = timeout_s

    def collect(self) -> Iterable[Metric]:
        try:
            with reads.deadline_cursor(self.reader, self.timeout_s) as cur:
                rows = cur.execute(GPU_LATEST, [self.window_s]).fetchall()
        except Exception:
            logger.exception("GPU gauges unavailable for this scrape")
            return
        by_name: dict[str, list[tuple[dict[str, str], float]]] = {}
        for instance_id, machine_id, name, labels, value in rows:
            points = {_LABEL_OK.sub("_", k): str(v) for k, v in orjson.loads(labels).items()}
            points.update(instance_id=instance_id, machine_id="" if machine_id is None else str(machine_id))
            by_name.setdefault(name, []).append((points, value))
        for name, points in sorted(by_name.items()):
            label_names = sorted({k for labels, _ in points for k in labels})
            family = GaugeMetricFamily(name, f"{name} (latest sample from the fleet's agents)", labels=label_names)
            for labels, value in points:
                family.add_metric([labels.get(k, "") for k in label_names], value)
            yield family
