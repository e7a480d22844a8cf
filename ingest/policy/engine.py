"""Lifecycle policies: the SQL rules in ``queries/policies/``, run on a timer or once. The timer's
next run is brought forward when the writer commits a logs_complete or a params_done (``wake``):
a destroy follows its evidence within a run or two, not at the next tick.

A rule file opens with a comment header (``-- rule:``, ``-- decides:``/``-- answers:``,
``-- params:``, ``-- output:``) and holds one SELECT. Rules run in file-name order on one cursor;
each result becomes a temporary table named after the rule, so later rules can read earlier ones.
Outputs:

- ``classify``: (instance_id, done_at, failure_class, failure_line, final[, class_priority,
  class_scanned_to, scanned_lines]) rows, stored on bench_runs before the other rules run; a class is
  rewritten until it is final (a class follows its evidence). The rule returns only the runs whose
  class may have changed and matches only the evidence received since a run was last classed (its
  progress, class_scanned_to and class_priority, kept on bench_runs), so a cycle costs what changed;
- ``table``: kept for later rules (and read by the hosts API);
- ``decisions``: (subject, action, reason, evidence, episode, expires_at) rows, stored once per
  (rule, subject, episode) in ``decisions``; while a decision is proposed (or is a verdict fleetlog
  acts on itself), a later run that decides it again with another reason or evidence (the class
  changed) updates it, so what depends on the class carries the current one.

The rules read the views of migration 005 (log_streams, instance_logs, bench_outcomes,
instance_phase, failures), the one definition of "logs complete", "failed" and "hung"; the values
those views compare against (min_rate, bench_timeout_s) are written by ``store_settings`` at start-up.

Each rule runs under its own deadline (``query_timeout_s``; the cycle's budget is the sum): a rule
that times out or fails is counted (``fleetlog_policy_rule_errors_total{rule,reason}``), shown as
failing (``fleetlog_policy_rule_failing{rule}``, ``/readyz``'s ``policy.failing_rules``) until it
succeeds again, and the other rules still run (a later rule that reads its table fails with it).

Verdicts that only fleetlog acts on (``exclude_host``, ``mark_stale``, ``flag_degraded``) are recorded as
executed; a ``rebenchmark`` stays ``proposed`` (for the orchestrator: nothing here carries it out).
``destroy`` and ``delete_logs`` stay ``proposed`` until a run with ``execute``: then at most
``destroy_cap_per_cycle`` actuator calls are made, for the destroys waiting longest first (since their
decision, or since their last failed attempt: a failing one goes to the back of the queue, so it
never holds the others up); a failed one is retried on later runs until ``actuator_retries`` attempts,
then marked ``failed``. Right before a destroy or a delete_logs is carried
out its rule is evaluated again on current data: if it no longer selects the subject, the decision becomes
``superseded`` and is not executed on that evidence (proposed again if a later run's rule selects its
subject again for the same episode: writes.store_decisions). A decision proposed, superseded, executed or failed is sent to
the notifier (``notify_webhook_url``). Everything is written through the writer.

The record's times are the real clock's, whatever ``now`` the rules are given: ``decided_at`` once
the rules that decided have run (after any evidence they read was stored), ``attempted_at`` and
``executed_at`` when the actuator call began, ``settled_at`` when the final state was recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import datetime as dt
import logging
import re
import time
import threading
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import orjson

from ingest.policy.actuator import ActuationError, Actuator
from ingest.contract.codec import Event
from ingest.policy.notify import Notifier
from ingest.metrics import IngestMetrics
from ingest.db import writes
from ingest.db.sqlfiles import Rule
from ingest.db.reads import (decisions_by_id, evaluate_rule, instance_state,
                             proposed_actions, relations_read, run_under_deadline)
from ingest.db.seqindex import StreamIndex
from ingest.db.tailcache import TailCache
from ingest.timestamps import now_us, utcnow
from ingest.db.writer import Writer

logger = logging.getLogger(__name__)

INTERNAL_ACTIONS = writes.INTERNAL_ACTIONS  # recorded as executed: nothing leaves fleetlog
# a commit that stores one of these wakes the timer's loop: the evidence a destroy waits for is complete
# (not bench_done: a cycle woken between a run's end and its last lines would class it on half its evidence)
WAKE_KINDS = frozenset({"logs_complete", "params_done"})
_ASK = object()  # _still_selected: no re-check made yet
DESTROYS = re.compile(r"'destroy'\s+AS\s+action\b", re.IGNORECASE)  # a rule that decides destroys (its SELECT says so)
EXCLUDES = re.compile(r"'exclude_host'\s+AS\s+action\b", re.IGNORECASE)  # a rule that gates machines (the deploy gate)


@dataclass(frozen=True)
class PolicyParams:
    min_rate: float
    destroy_grace_s: float
    bad_host_ttl_s: float
    stale_ttl_s: float
    retention_s: float
    exclude_repeats: int = 2
    bench_timeout_s: float = 3600.0
    public_url: str = ""  # the page's base URL, for the links in the rules' evidence
    degrade_action: str = "flag"
    # (the views' own settings, spike_* and degrade_recent_runs/fraction, go to policy_settings at start-up:
    # db.writes.store_settings, from ingest/core.py; no rule reads them as parameters)

    def values(self, now: dt.datetime) -> dict[str, Any]:
        return {
            "min_rate": self.min_rate, "destroy_grace_s": self.destroy_grace_s, "bad_host_ttl_s": self.bad_host_ttl_s,
            "stale_ttl_s": self.stale_ttl_s, "retention_s": self.retention_s, "exclude_repeats": self.exclude_repeats,
            "now": now, "public_url": self.public_url, "degrade_action": self.degrade_action,
        }


@dataclass
class CycleReport:
    execute: bool
    full: bool = True  # every rule ran (not only the failure class, the destroys and the gate: see run_cycle)
    classified: int = 0
    class_lines_scanned: int = 0
    new_decisions: list[int] = field(default_factory=list)
    updated: list[int] = field(default_factory=list)
    superseded: list[int] = field(default_factory=list)
    executed: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    deferred: list[int] = field(default_factory=list)  # not re-checked (its rule failed): left proposed
    capped: int = 0
    rule_errors: dict[str, str] = field(default_factory=dict)  # rule -> "timeout: ..." or "error: ..."

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class PolicyEngine:
    def __init__(
        self,
        con: Any,  # the Reader: the rules' cursors
        writer: Writer,
        index: StreamIndex,
        tail: TailCache,
        rules: list[Rule],
        params: PolicyParams,
        actuator: Actuator,
        metrics: IngestMetrics,
        *,
        destroy_cap_per_cycle: int,
        actuator_retries: int,
        query_timeout_s: float,
        notify_webhook_url: str = "",
        notify_timeout_s: float = 10.0,
        may_run: Callable[[], bool] | None = None,
        delete_logs: Callable[[str, Callable[[], None]], Awaitable[None]] | None = None,
        full_interval_s: float = 0.0,
    ) -> None:
        """``may_run`` (blocking, asked on a worker thread): whether this node runs the policies now
        (lake mode: the node holding the PostgreSQL advisory lock; a cycle elsewhere reports nothing).
        ``delete_logs(instance_id, after_commit)``: the retention rule carried out (the database's:
        lake mode carries it out in its delete window); by default, through the writer.
        ``full_interval_s``: the timer runs every rule at most this often; the runs between (woken by
        evidence, or ticks) run the failure class, the destroys and the machine exclusions only (0: every
        run runs every rule)."""
        self.con = con
        self.writer = writer
        self.index = index
        self.tail = tail
        self.rules = rules
        self.params = params
        self.actuator = actuator
        self.metrics = metrics
        self.cap = destroy_cap_per_cycle
        self.retries = actuator_retries
        self.timeout_s = query_timeout_s
        self.full_interval_s = full_interval_s
        self.may_run = may_run
        self._delete = delete_logs or self._delete_through_writer
        self._lock = asyncio.Lock()  # one cycle at a time: the timer and an operator's run never overlap
        self.notifier = Notifier(notify_webhook_url, notify_timeout_s, metrics.registry)
        self.failing: dict[str, str] = {}  # rule -> why its last evaluation in a cycle failed
        self._check: _Recheck | None = None  # the re-check of the run carrying decisions out
        self._loop: asyncio.AbstractEventLoop | None = None  # run_forever's, while it runs
        self._woken: asyncio.Event | None = None  # set (on that loop) by wake()
        self._decision_readers: dict[frozenset[str], bool] = {}  # see reads_decisions
        writer.watch_events(WAKE_KINDS, self.wake)
        for rule in rules:  # the series exist at 0 from start-up, so that the first failure alerts
            metrics.policy_rule_failing.labels(rule=rule.name).set(0)
            for reason in ("timeout", "error"):
                metrics.policy_rule_errors.labels(rule=rule.name, reason=reason)

    # -- one cycle -------------------------------------------------------------------------------
    async def run_cycle(self, execute: bool, now: dt.datetime | None = None, full: bool = True) -> CycleReport:
        """One run of the rules (``full``: all of them; otherwise the failure class, the rules that decide
        destroys and those that exclude machines, with what they read: what a decision waits for, and what
        an orchestrator reads before it rents; the timer's runs between its full ones, see run_forever)."""
        if self.may_run is not None and not await asyncio.to_thread(self.may_run):
            return CycleReport(execute, full)
        async with self._lock:
            started = time.perf_counter()
            now = now or utcnow()
            report = CycleReport(execute, full)
            try:
                params = self.params.values(now)
                evaluated_at: dict[str, float] = {}  # rule -> when its evaluation began (time.monotonic())
                acting, rest = self._phases(full)
                # the rules that decide destroys (and those they read) first, and their destroys carried out at
                # once: a destroy does not wait for the other rules (hosts, staleness, retention, spikes)
                await self._act(report, params, acting, execute, now, evaluated_at)
                # evidence stored while the destroy rule ran is decided on now, before the other rules, which it
                # waited for and then for a run of its own (the loaded sim's slowest decisions): once a run
                await self._between(report, execute, acting)
                # the others; in a full run one rule at a time, and evidence stored meanwhile (a wake-up) is decided
                # on once, between two of them, not after the slowest rules (see _between)
                decided = await self._evaluate_stepwise(params, report, rest, evaluated_at, execute, full, acting)
                decided = [(rule, row) for rule, row in decided if rule.name not in acting]  # decided once a run
                await self._store(report, decided, {"delete_logs"} if full else set(), execute, now, evaluated_at)
                self._note_health(report.rule_errors, set(evaluated_at) | {r.name for r in self.rules if r.output == "classify"})
            except Exception:
                self.metrics.policy_runs.labels(result="error").inc()
                raise
            self.metrics.policy_runs.labels(result="partial" if report.rule_errors else "ok").inc()
            self.metrics.policy_seconds.observe(time.perf_counter() - started)
            if report.new_decisions or report.executed or report.failed or report.superseded or report.rule_errors:
                logger.info("policy run: %s", report.as_dict())
            return report

    async def _classify_all(self, report: CycleReport, params: dict[str, Any]) -> None:
        """The class rules, their classes stored through the writer."""
        for rule in self.rules:
            if rule.output == "classify":
                rows = await asyncio.to_thread(self._classify, rule, params, report.rule_errors)
                if rows:
                    classified_at = utcnow()
                    await self.writer.execute(functools.partial(writes.store_classes, rows=rows, now=classified_at),
                                              kind="policy", touches=tuple(str(row[0]) for row in rows))
                report.classified += len(rows)
                scanned = sum(row[7] or 0 for row in rows if len(row) > 7)
                report.class_lines_scanned += scanned
                self.metrics.policy_class_lines.inc(scanned)

    async def _act(self, report: CycleReport, params: dict[str, Any], acting: set[str], execute: bool,
                   now: dt.datetime, evaluated_at: dict[str, float]) -> None:
        """The failure class, then the rules that decide destroys (``acting``), their decisions stored and
        their destroys carried out."""
        await self._classify_all(report, params)
        decided = await asyncio.to_thread(self._evaluate, params, report.rule_errors, acting, evaluated_at)
        await self._store(report, decided, {"destroy"}, execute, now, evaluated_at)

    async def _store(self, report: CycleReport, decided: list[tuple[Rule, tuple]], actions: set[str], execute: bool,
                     now: dt.datetime, evaluated_at: dict[str, float]) -> None:
        decided_at = utcnow()  # the rules have run: whatever they read was stored before this
        new, updated = await self.writer.execute(
            functools.partial(writes.store_decisions, decided=decided, now=decided_at), kind="policy", touches=())
        report.new_decisions += new
        report.updated += updated
        if new and self.notifier.enabled:
            for decision in await asyncio.to_thread(self._decisions, new):
                self.notifier.send("alert" if decision["action"] == "alert" else decision["state"], decision)
        if execute and actions:
            await self._carry_out(report, now, (evaluated_at, decided), actions)

    async def _evaluate_stepwise(self, params: dict[str, Any], report: CycleReport, only: set[str],
                                 evaluated_at: dict[str, float], execute: bool, pause: bool,
                                 acting: set[str]) -> list[tuple[Rule, tuple]]:
        """_evaluate off the event loop; with ``pause``, a rule at a time on one cursor (a rule reads the
        earlier ones' tables), and before each rule _between (``acting``: the run's destroy rules), as long
        as the pauses take no more time than the rules between them (a pause waits until the rules since
        the last one have run as long as it did)."""
        if not pause:
            return await asyncio.to_thread(self._evaluate, params, report.rule_errors, only, evaluated_at)
        decided: list[tuple[Rule, tuple]] = []
        paused_s = rules_s = 0.0  # the last pause's length; the rules' seconds since it
        with self.con.deadline_cursor(self._budget_s()) as cur:
            for rule in self._evaluated(only):
                if rules_s >= paused_s:
                    started = time.monotonic()
                    if await self._between(report, execute, acting):
                        paused_s, rules_s = time.monotonic() - started, 0.0
                started = time.monotonic()
                decided += await asyncio.to_thread(self._evaluate_one, rule, cur, params, report.rule_errors, evaluated_at)
                rules_s += time.monotonic() - started
        return decided

    async def _between(self, report: CycleReport, execute: bool, acting: set[str]) -> bool:
        """Between two rules of a run's second evaluation: if evidence was stored since the run began (a
        wake-up from run_forever), the class and the destroy rules run on it first, with what it is now (a
        full run's slowest rules took up to 2 s on a loaded host, and a destroy waited for them and then a
        run of its own). Their tables are their own cursor's: the evaluation that pauses keeps its own.
        Once in every run, right after its destroys; in full runs (every ``full_interval_s``) also between
        their other rules, at most about half of their time (see _evaluate_stepwise): the wake-ups' own runs
        are held to about half of the time by run_forever, and pauses before every rule of every run escaped
        that (one a run does what the run it spares would do first). True if it ran."""
        woken = self._woken
        if woken is None or not woken.is_set():
            return False
        woken.clear()
        self.metrics.policy_woken.inc()
        now = utcnow()
        await self._act(report, self.params.values(now), acting, execute, now, {})
        return True

    def _run_rule(self, rule: Rule, cur: Any, run: Callable[[], Any], errors: dict[str, str]) -> Any:
        """``run()`` under the rule's own deadline; a timeout or a failure is counted, noted in
        ``errors`` and returns None (the other rules go on). Storage failures end the cycle."""
        started = time.perf_counter()
        try:
            result, failure = run_under_deadline(cur, self.timeout_s, run)
        finally:
            self.metrics.policy_rule_seconds.labels(rule=rule.name).observe(time.perf_counter() - started)
        if failure is None:
            return result
        reason, message = failure
        self.metrics.policy_rule_errors.labels(rule=rule.name, reason=reason).inc()
        errors[rule.name] = f"{reason}: {message}"
        logger.error("policy rule %s failed (%s): %s; the other rules still run", rule.name, reason, message)
        return None

    def _budget_s(self) -> float:
        """The deadline of a whole evaluation: every rule's own, together."""
        return self.timeout_s * (len(self.rules) + 1)

    def _classify(self, rule: Rule, params: dict[str, Any], errors: dict[str, str]) -> list[tuple]:
        with self.con.deadline_cursor(self._budget_s()) as cur:
            rows = self._run_rule(rule, cur, lambda: cur.execute(rule.sql, {p: params[p] for p in rule.params}).fetchall(),
                                  errors)
        if rows is not None:
            errors.pop(rule.name, None)
        return rows or []

    def _evaluate(self, params: dict[str, Any], errors: dict[str, str] | None = None,
                  only: set[str] | None = None, started: dict[str, float] | None = None) -> list[tuple[Rule, tuple]]:
        """Run the rules in order, each under its own deadline (``only``: those named, see _needed);
        a rule that fails is noted in ``errors`` and decides nothing. ``started`` gets when each
        rule's evaluation began (time.monotonic(): the age of what it read)."""
        errors = {} if errors is None else errors
        started = {} if started is None else started
        decided = []
        with self.con.deadline_cursor(self._budget_s()) as cur:
            for rule in self._evaluated(only):
                decided += self._evaluate_one(rule, cur, params, errors, started)
        return decided

    def _evaluated(self, only: set[str] | None) -> list[Rule]:
        """The rules an evaluation runs, in order: those named (all with None), less the class rules."""
        return [r for r in self.rules if r.output != "classify" and (only is None or r.name in only)]

    def _evaluate_one(self, rule: Rule, cur: Any, params: dict[str, Any], errors: dict[str, str],
                      started: dict[str, float]) -> list[tuple[Rule, tuple]]:
        """One rule of an evaluation on its cursor: its decisions, if it decides."""
        started[rule.name] = time.monotonic()

        def run() -> list[tuple]:
            return evaluate_rule(cur, rule.name, rule.sql, {p: params[p] for p in rule.params},
                                 decides=rule.output == "decisions")

        rows = self._run_rule(rule, cur, run, errors)
        if rows is None:
            return []
        errors.pop(rule.name, None)
        return [(rule, row) for row in rows]

    def _phases(self, full: bool = True) -> tuple[set[str], set[str]]:
        """A run's two evaluations: the rules that decide destroys and those they read, then the others
        (``full`` false: only those that exclude machines) and those they read (an earlier rule's table is
        read on the cursor of the evaluation that needs it)."""
        decides = [r for r in self.rules if r.output == "decisions"]
        acting = self._needed({r.name for r in decides if DESTROYS.search(r.sql)})
        others = {r.name for r in self.rules if r.output != "classify"} if full else {
            r.name for r in decides if EXCLUDES.search(r.sql)}
        return acting, self._needed(others - acting)

    def _needed(self, names: set[str]) -> set[str]:
        """The rules named and the earlier ones whose tables they read (their name appears in the SQL),
        transitively: what a re-check has to run (a later rule cannot change an earlier one)."""
        needed = set(names)
        for i in range(len(self.rules) - 1, -1, -1):
            if self.rules[i].name in needed:
                needed.update(r.name for r in self.rules[:i] if re.search(rf"\b{re.escape(r.name)}\b", self.rules[i].sql))
        return needed

    def reads_decisions(self, names: set[str]) -> bool:
        """(In a worker thread.) Whether the rules ``names`` (and those they read) read the decisions
        table, which Writer.unchanged_since does not follow (the destroy rule does not; retention does)."""
        key = frozenset(names)
        if key not in self._decision_readers:
            sql = "\n".join(r.sql for r in self.rules if r.name in self._needed(set(names)))
            try:
                self._decision_readers[key] = "decisions" in self.con.read(relations_read, sql)
            except Exception as e:  # e.g. a read past its deadline on a loaded host: no shortcut this time
                logger.warning("which tables rules %s read is unknown (%s): their re-check evaluates them", sorted(names), e)
                return True
        return self._decision_readers[key]

    def _note_health(self, errors: dict[str, str], ran: set[str]) -> None:
        """After a cycle's evaluation: which rules are failing now (those that ran in it, as it found
        them; the others as their last run did)."""
        ran = ran | set(errors)
        self.failing = {name: why for name, why in self.failing.items() if name not in ran} | dict(errors)
        for rule in self.rules:
            self.metrics.policy_rule_failing.labels(rule=rule.name).set(1 if rule.name in self.failing else 0)

    def failing_rules(self) -> dict[str, str]:
        """The rules whose last evaluation failed, and why (shown by /readyz)."""
        return dict(self.failing)

    async def _carry_out(self, report: CycleReport, now: dt.datetime,
                         evaluated: tuple[dict[str, float], list[tuple[Rule, tuple]]] | None = None,
                         actions: set[str] = frozenset({"destroy", "delete_logs"})) -> None:
        """The proposed decisions of ``actions`` carried out. ``evaluated``: (when each rule began,
        what they decided) of this run's evaluation of those rules, the first re-check."""
        proposed = [d for d in await asyncio.to_thread(self._proposed) if d["action"] in actions]
        if not proposed:
            return
        self._check = _Recheck(self, {d["rule"] for d in proposed}, now)
        if evaluated is not None:
            self._check.seed(*evaluated, dict(report.rule_errors))
        try:
            await self._carry_out_proposed(proposed, report)
        finally:
            self._check = None

    async def _carry_out_proposed(self, proposed: list[dict[str, Any]], report: CycleReport) -> None:
        destroys = [d for d in proposed if d["action"] == "destroy"]
        calls = done = 0
        while done < len(destroys) and calls < self.cap:
            # waiting longest first, in waves carried out side by side (one actuator call does not wait
            # for another, and their records share the writer's commits); a destroy skipped or
            # superseded makes no call, so the next wave fills the cap with the next ones
            wave = destroys[done:done + self.cap - calls]
            done += len(wave)
            calls += sum(await asyncio.gather(*(self._destroy(decision, current, report)
                                                for decision, current in await self._wave(wave, report))))
        if done < len(destroys):
            report.capped = len(destroys) - done
            self.metrics.policy_capped.inc(report.capped)
            logger.warning("%d destroys proposed, %d actuator calls made (destroy_cap_per_cycle); %d wait for the next run",
                           len(destroys), calls, report.capped)
        for decision in (d for d in proposed if d["action"] == "delete_logs"):
            if not await self._still_selected(decision, report):
                continue
            instance_id = decision["subject"]

            def forget(instance_id: str = instance_id) -> None:  # on the writer thread, in step with the delete
                self.index.forget(instance_id)
                self.tail.forget(instance_id)

            started_at = utcnow()
            await self._delete(instance_id, forget)
            await self._settle(decision, "executed", None, attempted_at=started_at)
            report.executed.append(decision["id"])

    async def _delete_through_writer(self, instance_id: str, after_commit: Callable[[], None]) -> None:
        """The retention rule carried out: the instance's logs and metrics deleted through the writer.
        Lake mode hands its own (ingest/db/lake/jobs.py's RetentionWindow, through ingest/db/database.py)."""
        await self.writer.execute(functools.partial(writes.delete_logs, instance_id=instance_id), kind="policy",
                                  after_commit=after_commit, touches=(instance_id,))

    async def _wave(self, wave: list[dict[str, Any]], report: CycleReport) -> list[tuple[dict[str, Any], tuple[str, Any]]]:
        """The destroys of a wave that go ahead, each with its (reason, evidence) now: an instance
        already killed is skipped, then one re-check (one evaluation of the rules, when the last is
        too old) serves the whole wave."""
        states = await asyncio.to_thread(lambda: [self._instance_state(d["subject"]) for d in wave])
        live = []
        for decision, state in zip(wave, states):
            if state == "killed":
                await self._settle(decision, "skipped", "instance already killed")
                report.skipped.append(decision["id"])
            else:
                live.append(decision)
        asked = time.monotonic()
        currents = await asyncio.to_thread(
            lambda: [self._recheck(d, self._check.now if self._check else utcnow(), asked) for d in live])
        out = []
        for decision, current in zip(live, currents):
            current = await self._still_selected(decision, report, current)
            if current is not None:
                out.append((decision, current))
        return out

    async def _destroy(self, decision: dict[str, Any], current: tuple[str, Any], report: CycleReport) -> bool:
        """Carry out one proposed destroy, still selected with ``current`` (_wave); True when the
        actuator was called (what the cap counts)."""
        decision["reason"], decision["evidence"] = current  # carried out with what holds now
        attempted_at = utcnow()
        try:
            confirmation = await self.actuator.carry_out(decision)
        except ActuationError as e:
            attempts = decision["attempts"] + 1
            final = attempts >= self.retries
            logger.error("destroy of %s failed (attempt %d of %d): %s", decision["subject"], attempts, self.retries, e)
            await self._settle(decision, "failed" if final else "proposed", str(e), attempted_at=attempted_at)
            if final:
                report.failed.append(decision["id"])
            return True
        await self._settle(decision, "executed", confirmation, attempted_at=attempted_at)
        self.metrics.policy_destroy_delay.observe(max(0.0, (attempted_at - decision["decided_at"]).total_seconds()))
        report.executed.append(decision["id"])
        killed = Event(decision["subject"], "killed", now_us(),
                       {"instance_id": decision["subject"], "kind": "killed", "by": "policy",
                        "decision_id": decision["id"], "actuator": self.actuator.name, "confirmation": confirmation})
        await self.writer.submit(events=[killed], kind="events")
        logger.warning("destroyed %s (%s): %s", decision["subject"], decision["reason"], confirmation)
        return True

    async def _still_selected(self, decision: dict[str, Any], report: CycleReport,
                              current: Any = _ASK) -> tuple[str, Any] | None:
        """The decision's (reason, evidence) now, if its rule still selects its subject; otherwise the
        decision is settled as superseded (never carried out on stale evidence) and this is None (also
        when its rule could not be evaluated: then it stays proposed). ``current``: the re-check's
        answer when already made (_wave)."""
        if current is _ASK:
            current = await asyncio.to_thread(self._recheck, decision, self._check.now if self._check else utcnow())
        if self._check is not None:
            report.rule_errors.update(self._check.failed)
        if current is _UNKNOWN:
            report.deferred.append(decision["id"])
            logger.warning("%s of %s deferred: rule %s could not be evaluated again (%s)", decision["action"],
                           decision["subject"], decision["rule"], report.rule_errors.get(decision["rule"]))
            return None
        if current is None:
            await self._settle(decision, "superseded", f"rule {decision['rule']} no longer selects {decision['subject']}")
            report.superseded.append(decision["id"])
            logger.warning("%s of %s superseded: rule %s no longer selects it (%s)", decision["action"],
                           decision["subject"], decision["rule"], decision["reason"])
        return current

    async def _settle(self, decision: dict[str, Any], state: str, note: str | None,
                      attempted_at: dt.datetime | None = None) -> None:
        """Record what became of a decision; ``note`` is the error of a failed attempt, or why it was
        superseded (stored as last_error); an executed one keeps the evidence it was carried out with.
        ``attempted_at``: when the actuator call began (the executed_at of a success); settled_at is
        now, for every state but a retry (back to proposed)."""
        self.metrics.policy_decisions.labels(action=decision["action"], state=state).inc()
        error = None if state == "executed" else note
        evidence = orjson.dumps(decision["evidence"], default=str).decode()
        settled_at = None if state == "proposed" else utcnow()

        update = functools.partial(writes.settle_decision, decision_id=decision["id"], state=state, error=error,
                                   attempted_at=attempted_at, settled_at=settled_at, reason=decision["reason"],
                                   evidence=evidence)
        await self.writer.execute(update, kind="policy", touches=())  # decisions only
        if state in ("executed", "failed", "superseded"):
            self.notifier.send(state, {**decision, "state": state, "note": note})

    def _recheck(self, decision: dict[str, Any], now: dt.datetime, asked: float | None = None) -> Any:
        """(In a worker thread.) The (reason, evidence) with which the decision's rule selects its
        subject for its action now, None when it no longer does, _UNKNOWN when its rule failed; from
        the run's shared re-check (_Recheck; ``asked``: see _Recheck.current)."""
        check = self._check or _Recheck(self, {decision["rule"]}, now)
        return check.current(decision, asked)

    def _selected(self, names: set[str], now: dt.datetime, started: dict[str, float] | None = None
                  ) -> tuple[list[tuple[Rule, tuple]], dict[str, str]]:
        """Evaluate the rules ``names`` need on current data: what they decide, and which failed
        (``started``: see _evaluate)."""
        failed: dict[str, str] = {}
        return self._evaluate(self.params.values(now), errors=failed, only=self._needed(names), started=started), failed

    def _decisions(self, ids: list[int]) -> list[dict[str, Any]]:
        return self.con.read(decisions_by_id, ids)

    async def close(self, timeout_s: float = 5.0) -> None:
        """Let the notifications in flight finish (at most ``timeout_s``)."""
        await self.notifier.drain(timeout_s)

    def _proposed(self) -> list[dict[str, Any]]:
        return self.con.read(proposed_actions)

    def _instance_state(self, instance_id: str) -> str | None:
        return self.con.read(instance_state, instance_id)

    # -- the timer -------------------------------------------------------------------------------
    def wake(self) -> None:
        """Bring the timer's next cycle forward: evidence a decision waits for was stored (a
        logs_complete or a params_done; the writer calls this right after the commit, on its own
        thread). A no-op while run_forever is not running."""
        loop, woken = self._loop, self._woken
        if loop is not None and woken is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(woken.set)

    async def run_forever(self, interval_s: float, execute: bool, stop: asyncio.Event) -> None:
        """Run a cycle every ``interval_s`` until ``stop`` is set (a running cycle finishes first);
        runs missed while one ran long are counted, not replayed. A wake-up (wake()) runs a cycle
        as soon as the one running has finished, instead of at the next tick: wake-ups that arrive
        while a cycle runs make one cycle after it. Woken cycles take at most about half of the time:
        each one earns the time since the last woken cycle ended, up to its own length, and spends
        its length; one that leaves a debt makes the next woken cycle wait it out (never past the next
        tick). So evidence stored just after a woken cycle began is seen by a cycle right after it
        (two back to back), and only a storm of wake-ups is held. A cycle starts at least every
        ``interval_s`` whatever woke it. Every rule runs
        at most every ``full_interval_s`` (and at the first run); the runs between run what a destroy
        and the deploy gate wait for (run_cycle's ``full``), so the rules that look back over hours
        (staleness, retention, degradation, spikes) do not hold up a decision on a loaded host."""
        self._loop, self._woken = asyncio.get_running_loop(), asyncio.Event()
        woken = self._woken
        next_at = time.monotonic()
        full_at = next_at  # when the next run that runs every rule is due
        hold_until = 0.0  # after a woken cycle: the earliest a wake-up starts the next
        credit = 0.0  # seconds of woken cycles that may still run back to back (negative: a debt)
        woken_ended = float("-inf")  # when the last woken cycle ended
        try:
            while not stop.is_set():
                now = time.monotonic()
                due = min(next_at, max(now, hold_until)) if woken.is_set() else next_at
                if due > now:
                    waits = [asyncio.ensure_future(stop.wait())]
                    if not woken.is_set():
                        waits.append(asyncio.ensure_future(woken.wait()))
                    try:
                        await asyncio.wait(waits, timeout=due - now, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        for w in waits:
                            w.cancel()
                    continue
                timed = now >= next_at
                woken.clear()  # what is stored from here on is seen by this cycle or brings the next one
                started = time.monotonic()
                full = started >= full_at
                if full:
                    full_at = started + self.full_interval_s
                try:
                    await self.run_cycle(execute, full=full)
                except Exception:
                    logger.exception("policy run failed; next run in %.0f s", interval_s)
                if timed:
                    hold_until = 0.0
                    next_at += interval_s
                    late = time.monotonic() - next_at
                    if late > 0:
                        missed = int(late // interval_s) + 1
                        self.metrics.policy_missed.inc(missed)
                        next_at += missed * interval_s
                else:
                    self.metrics.policy_woken.inc()
                    ended = time.monotonic()
                    took = ended - started
                    credit = min(credit + (started - woken_ended), took) - took
                    woken_ended = ended
                    hold_until = ended + max(0.0, -credit)
                    next_at = max(next_at, started + interval_s)
        finally:
            self._loop = self._woken = None


_UNKNOWN = object()  # a recheck whose rule failed: neither selected nor superseded
RECHECK_MAX_AGE_S = 1.0  # a decision is carried out on an evaluation of its rule at most this old


class _Recheck:
    """Right before a decision is carried out, its rule is evaluated again on current data. One
    evaluation (of the rules the run's proposed decisions need) serves the decisions carried out
    after it until it is RECHECK_MAX_AGE_S old (its age: since the first of those rules began), and
    serves every decision asked about before it began (a wave of destroys, _wave): a run of destroys
    does not evaluate the rules once per destroy, and none is carried out on evidence older than that.
    Whatever its age, it serves a decision whose subject (an instance: destroys and log deletions are
    re-checked) no commit changed since it began (Writer.unchanged_since), if its rules do not read the
    decisions (which that does not follow): the rules read an instance's own rows, and what may change
    any (settings, patterns, enrollments) is noted as changing all. On a
    loaded host the evaluation, the decisions' commit and the wave's reads took over a second, and
    each destroy waited for a second evaluation of rules that had nothing new to read (the fleet sim).
    (Not "older than the evaluation took": under load the seconds between a cycle's evaluation and the
    actuator call held a healthy instance's bench_done, and it was destroyed as hung: the fleet sim.)"""

    def __init__(self, engine: PolicyEngine, names: set[str], now: dt.datetime) -> None:
        self.engine, self.names, self.now = engine, names, now
        self.at: float | None = None
        self.selected: dict[tuple[str, str, str], tuple[str, Any]] = {}
        self.failed: dict[str, str] = {}
        self.lock = threading.Lock()  # one evaluation at a time, shared by whoever waited for it

    def seed(self, at: dict[str, float], decided: list[tuple[Rule, tuple]], failed: dict[str, str]) -> None:
        """An evaluation whose rules began at ``at`` (rule -> time.monotonic()) that serves as the
        first re-check; its age is that of the oldest of the rules the re-check needs."""
        needed = self.engine._needed(self.names)
        self.at = min((t for name, t in at.items() if name in needed), default=min(at.values(), default=None))
        self.failed, self.selected = failed, {}
        for rule, (subject, action, reason, evidence, _episode, _expires_at) in decided:
            self.selected.setdefault((rule.name, str(subject), action), (reason, orjson.loads(evidence)))

    def current(self, decision: dict[str, Any], asked: float | None = None) -> Any:
        """(In a worker thread.) The (reason, evidence) with which the decision's rule selects its subject
        for its action now, None when it no longer does, _UNKNOWN when its rule failed (a timeout is no
        evidence either way). ``asked`` (time.monotonic()): an evaluation begun since then is fresh
        enough whatever its age (the wave it serves was asked about before it)."""
        with self.lock:
            fresh = self.at is not None and (
                (asked is not None and self.at >= asked) or time.monotonic() - self.at <= RECHECK_MAX_AGE_S
                or (decision["rule"] not in self.failed  # nothing of its subject stored since: still the answer
                    and self.engine.writer.unchanged_since(str(decision["subject"]), self.at)
                    and not self.engine.reads_decisions(self.names)))
            if not fresh:
                at: dict[str, float] = {}
                decided, failed = self.engine._selected(self.names, self.now, at)
                self.seed(at, decided, failed)
        if decision["rule"] in self.failed:
            return _UNKNOWN
        return self.selected.get((decision["rule"], decision["subject"], decision["action"]))
