"""Fleet gauges on /metrics, read from the database at scrape time (prometheus-client Collector).

So that Grafana can draw the fleet through Prometheus: instances by state, best benchmark rate per
machine, bad and eligible machines, failed runs by class, failed instances by phase, instances with
incomplete logs, decisions by action and state, and the free space of the database's volume. Each
scrape runs a few small queries on a cursor of the Reader (``ingest/reader.py``), with a deadline.
"Failed", "hung" and "logs complete" are the views of migration 005 (bench_outcomes, instance_phase,
instance_logs), the same definitions the rules, the canned questions and the read API use.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

import orjson

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ingest import reads
from ingest.policy import utcnow

if TYPE_CHECKING:
    from ingest.reader import Reader

logger = logging.getLogger(__name__)

# per lifecycle phase: instances, those alive whose latest step failed (by the phase it failed in), and
# those whose logs are expected and not complete; one pass over instance_phase (migration 005)
INSTANCES = """SELECT phase, CASE WHEN phase <> 'killed' THEN failed_phase END, logs_incomplete, count(*)
               FROM instance_phase GROUP BY ALL"""
FAILED_BY_CLASS = "SELECT coalesce(failure_class, 'unclassified'), count(*) FROM bench_outcomes WHERE failed GROUP BY 1"
DECISIONS = "SELECT action, state, count(*) FROM decisions GROUP BY 1, 2"


class FleetCollector(Collector):
    def __init__(self, reader: "Reader", hosts_sql: str, min_rate: float, timeout_s: float, db_path: str | Path) -> None:
        self.reader = reader
        self.hosts_sql = hosts_sql
        self.min_rate = min_rate
        self.timeout_s = timeout_s
        self.db_dir = Path(db_path).resolve().parent

    def collect(self) -> Iterable[Metric]:
        try:
            yield from self._collect()
        except Exception:  # a scrape must not fail because the fleet query did
            logger.exception("fleet gauges unavailable for this scrape")

    def _collect(self) -> Iterable[Metric]:
        with reads.deadline_cursor(self.reader, self.timeout_s) as cur:
            instances = cur.execute(INSTANCES).fetchall()
            failed = cur.execute(FAILED_BY_CLASS).fetchall()
            decisions = cur.execute(DECISIONS).fetchall()
        hosts = reads.hosts(self.reader, self.timeout_s, self.hosts_sql, self.min_rate, utcnow())

        by_state: dict[str, int] = {}
        failed_phase: dict[str, int] = {}
        for phase, failed_in, logs_incomplete, n in instances:
            by_state[phase] = by_state.get(phase, 0) + n
            if failed_in is not None:
                failed_phase[failed_in] = failed_phase.get(failed_in, 0) + n
        incomplete = sum(n for _phase, _failed_in, logs_incomplete, n in instances if logs_incomplete)
        g = GaugeMetricFamily("fleetlog_fleet_instances", "Instances by lifecycle state", labels=["state"])
        for state, n in sorted(by_state.items()):
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
        g = GaugeMetricFamily("fleetlog_fleet_failed_instances",
                              "Instances not killed whose latest step failed, by phase (params, benchmark)", labels=["phase"])
        for phase, n in sorted(failed_phase.items()):
            g.add_metric([phase], n)
        yield g
        yield GaugeMetricFamily("fleetlog_fleet_incomplete_log_instances",
                                "Instances whose logs are expected and not complete (instance_logs.incomplete: "
                                "no logs_complete, a gap, or lines the agent dropped)", value=incomplete)
        g = GaugeMetricFamily("fleetlog_policy_decisions", "Decisions by action and state", labels=["action", "state"])
        for action, state, n in decisions:
            g.add_metric([action, state], n)
        yield g
        yield from _storage(self.db_dir)


def _storage(directory: Path) -> Iterable[Metric]:
    try:
        usage = shutil.disk_usage(directory)
    except OSError:
        logger.exception("free space of %s unavailable for this scrape", directory)
        return
    yield GaugeMetricFamily("fleetlog_storage_free_bytes", "Free bytes on the database's volume", value=usage.free)
    yield GaugeMetricFamily("fleetlog_storage_size_bytes", "Size in bytes of the database's volume", value=usage.total)


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
