"""The server's own Prometheus metrics, on a per-app registry (nothing global, nothing at import).

Counters and histograms are updated where things happen (the writer, the handlers); gauges that
describe live state (queue depth, streams, tail cache) are read at scrape time by a Collector, as
prometheus-client's process collector does.
"""

from __future__ import annotations

from typing import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ingest.errors import refusal_reasons

# Series that exist at 0 from start-up: Prometheus' increase() sees no rise at a counter's first
# increment when the series did not exist before it, so the first burst would never alert.
DESTROY_OUTCOMES = ("executed", "failed", "superseded", "skipped")


class IngestMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.accepted = Counter(
            "fleetlog_ingest_accepted_rows_total", "Rows committed, by kind of push", ["kind"], registry=registry
        )
        self.duplicates = Counter(
            "fleetlog_ingest_duplicate_rows_total",
            "Rows already stored (same instance, source, run_id, seq) and skipped",
            ["kind"],
            registry=registry,
        )
        self.rejected = Counter(
            "fleetlog_ingest_rejected_requests_total", "Requests refused, by reason", ["reason"], registry=registry
        )
        self.commit_errors = Counter(
            "fleetlog_ingest_commit_errors_total", "Group commits the database refused", registry=registry
        )
        self.commit_seconds = Histogram(
            "fleetlog_ingest_commit_seconds",
            "Time to write and commit one group",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=registry,
        )
        self.batch_rows = Histogram(
            "fleetlog_ingest_batch_rows",
            "Rows per group commit",
            buckets=(1, 10, 100, 1_000, 10_000, 50_000, 100_000, 250_000),
            registry=registry,
        )
        self.policy_runs = Counter(
            "fleetlog_policy_runs_total", "Policy runs, by result", ["result"], registry=registry
        )
        self.policy_missed = Counter(
            "fleetlog_policy_missed_runs_total", "Timer runs skipped because a run took longer than the interval",
            registry=registry,
        )
        self.policy_woken = Counter(
            "fleetlog_policy_woken_runs_total",
            "Timer runs brought forward by a wake-up (a logs_complete or params_done stored)",
            registry=registry,
        )
        self.policy_capped = Counter(
            "fleetlog_policy_capped_destroys_total", "Proposed destroys held back by destroy_cap_per_cycle",
            registry=registry,
        )
        self.policy_decisions = Counter(
            "fleetlog_policy_actuations_total", "Decisions carried out, by action and resulting state",
            ["action", "state"], registry=registry,
        )
        self.policy_seconds = Histogram(
            "fleetlog_policy_run_seconds", "Time of one policy run", registry=registry
        )
        self.policy_rule_seconds = Histogram(
            "fleetlog_policy_rule_seconds", "Time of one policy rule's evaluation, by rule", ["rule"], registry=registry
        )
        self.policy_rule_errors = Counter(
            "fleetlog_policy_rule_errors_total",
            "Policy rule evaluations that failed, by rule and reason (timeout: past query_timeout_s; error)",
            ["rule", "reason"], registry=registry,
        )
        self.policy_rule_failing = Gauge(
            "fleetlog_policy_rule_failing", "1 while a rule's last evaluation in a policy run failed", ["rule"],
            registry=registry,
        )
        self.policy_class_lines = Counter(
            "fleetlog_policy_class_lines_scanned_total", "Lines the failure_class rule matched against its patterns",
            registry=registry,
        )
        self.policy_destroy_delay = Histogram(
            "fleetlog_policy_destroy_delay_seconds", "From a destroy's decision to the actuator call that carried it out",
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 1800), registry=registry,
        )
        self.client_disconnects = Counter(
            "fleetlog_http_client_disconnects", "Requests whose client went away before its body arrived", registry=registry
        )
        self.connections_refused = Counter(
            "fleetlog_http_connections_refused", "Connections closed on arrival: over http_max_connections", registry=registry
        )
        self.header_timeouts = Counter(
            "fleetlog_http_header_timeouts", "Connections closed for not sending a request head within http_header_timeout_s",
            registry=registry,
        )
        self.log_suppressed = Counter(
            "fleetlog_log_suppressed_records", "Repeated log records held back by the rate limit on logs", registry=registry
        )
        self.query_seconds = Histogram(
            "fleetlog_query_seconds", "Time of read and SQL API queries", ["api"], registry=registry
        )
        for reason in refusal_reasons():
            self.rejected.labels(reason=reason)
        for state in DESTROY_OUTCOMES:
            self.policy_decisions.labels(action="destroy", state=state)


class LiveStateCollector(Collector):
    """Gauges and counters read from live objects at scrape time (a name ending in ``_total`` is
    a counter)."""

    def __init__(self, values: dict[str, tuple[str, Callable[[], float]]]) -> None:
        self._values = values

    def collect(self) -> Iterable[Metric]:
        for name, (help_text, read) in self._values.items():
            if name.endswith("_total"):
                yield CounterMetricFamily(name.removesuffix("_total"), help_text, value=read())
            else:
                yield GaugeMetricFamily(name, help_text, value=read())
