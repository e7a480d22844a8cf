"""Fleet gauges on /metrics, read from the database at scrape time (prometheus-client Collector).

So that Grafana can draw the fleet through Prometheus: instances by state, best benchmark rate per
machine, bad and eligible machines, failed runs by class, failed instances by phase, instances with
incomplete logs, decisions by action and state, and the free space of the database's volume. Each
scrape runs a few small queries on a cursor of the Reader (``ingest/db/reader.py``), with a deadline.
"Failed", "hung" and "logs complete" are the views of migration 005 (bench_outcomes, instance_phase,
instance_logs), the same definitions the rules, the canned questions and the read API use.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

import orjson

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ingest.contract import promnames
from ingest.db import reads
from ingest.timestamps import utcnow

if TYPE_CHECKING:
    from ingest.db.reader import Reader

logger = logging.getLogger(__name__)

# per lifecycle phase: instances, those alive whose latest step failed (by the phase it failed in), and
# those whose logs are expected and not complete; one pass over instance_phase (migration 005)
INSTANCES = """SELECT phase, CASE WHEN phase <> 'killed' THEN failed_phase END, logs_incomplete, count(*)
               FROM instance_phase GROUP BY ALL"""
FAILED_BY_CLASS = "SELECT coalesce(failure_class, 'unclassified'), count(*) FROM bench_outcomes WHERE failed GROUP BY 1"
DECISIONS = "SELECT action, state, count(*) FROM decisions GROUP BY 1, 2"
# failure spikes up now (failure_spikes, migration 018), and the money burning on instances with no
# proof yet (unproven_burn, migration 015): Prometheus's FleetlogFailureSpike and the Grafana money row
SPIKES = "SELECT failure_class, gpu_model, failures FROM failure_spikes WHERE firing ORDER BY 1, 2"
BURN = "SELECT count(*), coalesce(sum(usd_per_hour), 0) FROM unproven_burn"


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
        with self.reader.deadline_cursor(self.timeout_s) as cur:
            instances = cur.execute(INSTANCES).fetchall()
            failed = cur.execute(FAILED_BY_CLASS).fetchall()
            decisions = cur.execute(DECISIONS).fetchall()
            spikes = cur.execute(SPIKES).fetchall()
            burning, burn_per_hour = cur.execute(BURN).fetchone()
        hosts = self.reader.read(reads.hosts, self.hosts_sql, self.min_rate, utcnow())

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
        g = GaugeMetricFamily("fleetlog_fleet_failure_spikes",
                              "Failures in each spike up now: spike_failures or more of one class on one GPU model within "
                              "spike_window_s (failure_spikes)", labels=["failure_class", "gpu_model"])
        for failure_class, gpu_model, n in spikes:
            g.add_metric([failure_class, gpu_model], n)
        yield g
        yield GaugeMetricFamily("fleetlog_fleet_unproven_instances", "Living instances with no proof yet (unproven_burn)",
                                value=burning)
        yield GaugeMetricFamily("fleetlog_fleet_unproven_burn_dollars_per_hour",
                                "Dollars per hour rented by living instances with no proof yet (unproven_burn)",
                                value=burn_per_hour)
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


# The latest value of each GPU series (instance, name, labels) received in the window, at most
# $per_instance per instance and $total in all; the total is shared round-robin (every instance's first
# series before anyone's second), so one busy instance cannot push the others out. The same series are
# kept from one scrape to the next (ordered by name and labels). Also: how many series there were over
# each cap, counted before the caps are applied.
GPU_LATEST = r"""
WITH latest AS (
    SELECT m.instance_id, i.machine_id, m.name, m.labels, arg_max(m.value, m.ts) AS value
    FROM metrics m
    LEFT JOIN instances i USING (instance_id)
    LEFT JOIN instance_state s USING (instance_id)
    WHERE m.received_at >= now()::TIMESTAMP - to_seconds($window_s::DOUBLE)
      AND m.name LIKE 'DCGM\_FI\_%' ESCAPE '\'
      AND coalesce(s.state, '') <> 'killed'
    GROUP BY ALL
), ranked AS (
    SELECT *, row_number() OVER (PARTITION BY instance_id ORDER BY name, labels) AS nth FROM latest
)
SELECT instance_id, machine_id, name, labels, value,
       (SELECT count(*) FROM ranked WHERE nth > $per_instance) AS over_instance_cap,
       count(*) OVER () AS under_instance_cap
FROM ranked
WHERE nth <= $per_instance
ORDER BY nth, instance_id, name, labels
LIMIT $total
"""
DROP_REASONS = ("instance_cap", "total_cap", "metric_name", "label_name", "label_size", "duplicate")


class GpuCollector(Collector):
    """The latest value of every GPU metric (DCGM-exporter names) per instance and GPU, from the
    samples received in the last ``window_s``; a killed or silent instance drops out.

    Bounded and valid whatever is stored: at most ``max_series_per_instance`` series per instance and
    ``max_series`` in all; names and labels that break Prometheus's rules (``ingest/contract/promnames.py``;
    the doors refuse them, rows stored before may hold them) and series that render the same as another
    are left out. Each series left out of a scrape counts in ``fleetlog_gpu_series_dropped_total``
    {reason} at that scrape, yielded after the gauges so that a scrape shows its own drops."""

    def __init__(self, reader: "Reader", window_s: float, timeout_s: float, max_series: int,
                 max_series_per_instance: int) -> None:
        self.reader = reader
        self.window_s = window_s
        self.timeout_s = timeout_s
        self.max_series = max_series
        self.max_series_per_instance = max_series_per_instance
        self.dropped = Counter("fleetlog_gpu_series_dropped_total",
                               "GPU series left out of a scrape of /metrics, by reason (counted at each scrape)",
                               ["reason"], registry=None)
        for reason in DROP_REASONS:
            self.dropped.labels(reason=reason)

    def collect(self) -> Iterable[Metric]:
        try:
            yield from self._gauges()
        except Exception:
            logger.exception("GPU gauges unavailable for this scrape")
        yield from self.dropped.collect()

    def _gauges(self) -> Iterable[Metric]:
        params = {"window_s": self.window_s, "per_instance": self.max_series_per_instance, "total": self.max_series}
        with self.reader.deadline_cursor(self.timeout_s) as cur:
            rows = cur.execute(GPU_LATEST, params).fetchall()
        if not rows:
            return
        self._drop("instance_cap", rows[0][5])
        self._drop("total_cap", rows[0][6] - len(rows))
        families: dict[str, Metric] = {}
        seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        for instance_id, machine_id, name, labels, value, _over, _under in rows:
            if promnames.check_metric_name(name) is not None:
                self._drop("metric_name")
                continue
            stored = orjson.loads(labels)
            points = {promnames.translate(k): str(v) for k, v in stored.items()}
            if any(promnames.check_label_name(k) is not None for k in points):
                self._drop("label_name")
                continue
            if sum(len(k) + len(v) for k, v in points.items()) > promnames.MAX_LABEL_CHARS:
                self._drop("label_size")
                continue
            points.update(instance_id=instance_id, machine_id="" if machine_id is None else str(machine_id))
            key = (name, tuple(sorted(points.items())))
            if key in seen:
                self._drop("duplicate")
                continue
            seen.add(key)
            family = families.get(name)
            if family is None:
                family = families[name] = Metric(name, f"{name} (latest sample from the fleet's agents)", "gauge")
            family.add_sample(name, dict(key[1]), value)
        for _name, family in sorted(families.items()):
            yield family

    def _drop(self, reason: str, n: int = 1) -> None:
        if n:
            self.dropped.labels(reason=reason).inc(n)
