"""Every named write: what the writer commits besides the batches (ingest/db/store.py), each a
function of the write connection and plain values, run on the writer thread in its transaction
(``Writer.execute(functools.partial(writes.x, ...))``) and testable alone on a DuckDB connection.

- ``store_settings``: the values the views of migration 005 compare against (start-up);
- ``store_classes``, ``store_decisions``, ``settle_decision``: the policy engine's record;
- ``delete_logs``: the retention rule carried out (the one statement, lake mode's too);
- ``recount_stream_lines``: log_stream_lines (019) counted again from the stored lines, after a bulk
  load that bypassed the writer's batches (tests' and benches' fleets inserted with one INSERT);
- ``store_verdict``: an operator's verdict on a host;
- ``write_instance_token``, ``store_issued``: instance tokens (and the enrollments they record).
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

import duckdb
import orjson

from ingest.db import enrollment, store
from ingest.timestamps import utcnow

if TYPE_CHECKING:
    from ingest.db.sqlfiles import Rule

INTERNAL_ACTIONS = {"exclude_host", "mark_stale", "alert", "flag_degraded"}  # recorded as executed: nothing to carry out
# (an alert is its notification: sent as event "alert" when decided, once per episode)


def store_settings(con: duckdb.DuckDBPyConnection, *, min_rate: float, bench_timeout_s: float,
                   spike_failures: float, spike_window_s: float, degrade_recent_runs: float,
                   degrade_fraction: float, degrade_exclude: bool) -> None:
    """Write the values the views of migrations 005, 016 and 018 compare against (``policy_settings``);
    called on the write connection at start-up, before the writer thread owns it."""
    values = {"min_rate": min_rate, "bench_timeout_s": bench_timeout_s, "spike_failures": spike_failures,
              "spike_window_s": spike_window_s, "degrade_recent_runs": degrade_recent_runs,
              "degrade_fraction": degrade_fraction, "degrade_exclude": float(degrade_exclude)}
    now = utcnow()
    rows = ", ".join("(?, ?::DOUBLE, ?::TIMESTAMP)" for _ in values)  # a VALUES list: lake mode's table is PostgreSQL's
    con.execute(f"INSERT OR REPLACE INTO policy_settings (name, value, set_at) SELECT * FROM (VALUES {rows})",
                [x for name, value in values.items() for x in (name, float(value), now)])


def store_classes(con: duckdb.DuckDBPyConnection, rows: list[tuple], now: dt.datetime) -> int:
    """Write each run's current class, the line that decided it and how far its evidence was read
    (a rule returning the first five columns only keeps no progress), until the class is final."""
    for instance_id, done_at, failure_class, failure_line, final, *progress in rows:
        priority, scanned_to = (list(progress) + [None, None])[:2]
        con.execute(
            """UPDATE bench_runs SET failure_class = ?, failure_line = ?, class_final = ?, classified_at = ?,
                                     class_priority = ?, class_scanned_to = ?
               WHERE instance_id = ? AND done_at = ? AND NOT coalesce(class_final, false)""",
            [failure_class, failure_line, bool(final), now, priority, scanned_to, instance_id, done_at],
        )
    return len(rows)


def store_decisions(con: duckdb.DuckDBPyConnection, decided: list[tuple["Rule", tuple]], now: dt.datetime
                     ) -> tuple[list[int], list[int]]:
    """Insert what is new (decided at ``now``: when the rules had run); a decision still proposed, or a
    verdict fleetlog acts on itself, decided again with another reason or evidence takes the new ones;
    a superseded one decided again is proposed again (decided at ``now``, counted as new).
    Returns (new ids, updated ids).

    What is new is inserted in one statement, whatever its number: in a transaction, each DuckDB
    ``INSERT ... ON CONFLICT`` holds ~150 KiB of transaction-local memory until the commit, so a cycle
    deciding 1,600 things at once (a fleet gone silent: a mark_stale each) ran the commit out of
    DuckDB's 256 MiB (503, and the next cycle again), tests/test_policy_scale.py."""
    new_ids, updated, reopened = [], [], []
    subjects = sorted({str(subject) for _rule, (subject, *_rest) in decided})
    held_rows = con.execute(  # one query for what is held, whatever the number of decisions
        "SELECT rule, subject, episode, id, state, reason, evidence::VARCHAR FROM decisions "
        "WHERE subject IN (SELECT unnest(?::VARCHAR[]))", [subjects]).fetchall() if subjects else []
    holding = {(r, subj, ep): rest for r, subj, ep, *rest in held_rows}
    fresh: dict[tuple[str, str, str], tuple] = {}  # the first of each (rule, subject, episode), in order
    for rule, (subject, action, reason, evidence, episode, expires_at) in decided:
        internal = action in INTERNAL_ACTIONS
        key = (rule.name, str(subject), episode)
        held = holding.get(key)
        if held:
            decision_id, state, held_reason, held_evidence = held
            if state == "superseded" and not internal:
                # its rule selects it again: what made it stale has passed (an instance's new stream, seen
                # between the decision and its re-check, declared complete since), so it stands again
                # (superseded had made the episode's destroy impossible for good, tests/fleetsim.py)
                con.execute("UPDATE decisions SET state = 'proposed', reason = ?, evidence = ?, rule_sha = ?, decided_at = ?, "
                            "settled_at = NULL, last_error = NULL WHERE id = ?",
                            [reason, evidence, rule.sha, now, decision_id])
                reopened.append(decision_id)
                continue
            changed = held_reason != reason or orjson.loads(held_evidence) != orjson.loads(evidence)
            if changed and (state == "proposed" or (internal and state == "executed")):
                con.execute("UPDATE decisions SET reason = ?, evidence = ?, rule_sha = ? WHERE id = ?",
                            [reason, evidence, rule.sha, decision_id])
                updated.append(decision_id)
            continue
        fresh.setdefault(key, (rule.sha, action, reason, evidence, expires_at, "executed" if internal else "proposed"))
    if not fresh:
        return reopened, updated
    keys = list(fresh)
    columns = list(zip(*(k + v for k, v in fresh.items())))
    names, shas, subject_ids, actions, reasons, evidences, episodes, expires, states = (
        columns[0], columns[3], columns[1], columns[4], columns[5], columns[6], columns[2], columns[7], columns[8])
    # no RETURNING and no ON CONFLICT: lake mode's decisions table is PostgreSQL's (ingest/db/lake/storage.py), and
    # DuckDB's postgres scanner stores only the first row of an INSERT ... SELECT ... ON CONFLICT DO NOTHING
    con.execute(
        """INSERT INTO decisions (rule, rule_sha, subject, action, reason, evidence, episode, decided_at, expires_at,
                                  state, executed_at, settled_at)
           SELECT rule, rule_sha, subject, action, reason, evidence, episode, $now, expires_at, state,
                  CASE WHEN state = 'executed' THEN $now END, CASE WHEN state = 'executed' THEN $now END
           FROM (SELECT unnest($rule::VARCHAR[]) AS rule, unnest($sha::VARCHAR[]) AS rule_sha,
                        unnest($subject::VARCHAR[]) AS subject, unnest($action::VARCHAR[]) AS action,
                        unnest($reason::VARCHAR[]) AS reason, unnest($evidence::VARCHAR[]) AS evidence,
                        unnest($episode::VARCHAR[]) AS episode, unnest($expires::TIMESTAMP[]) AS expires_at,
                        unnest($state::VARCHAR[]) AS state) AS n
           WHERE NOT EXISTS (SELECT 1 FROM decisions d WHERE d.rule = n.rule AND d.subject = n.subject
                             AND d.episode = n.episode)""",
        {"now": now, "rule": list(names), "sha": list(shas), "subject": list(subject_ids), "action": list(actions),
         "reason": list(reasons), "evidence": list(evidences), "episode": list(episodes), "expires": list(expires),
         "state": list(states)},
    )
    # the ones this commit inserted (decided at ``now``; one held already, e.g. another node's, kept its own)
    ids = {(r, subj, ep): i for r, subj, ep, i in con.execute(
        "SELECT rule, subject, episode, id FROM decisions WHERE decided_at = ?::TIMESTAMP "
        "AND subject IN (SELECT unnest(?::VARCHAR[]))", [now, sorted(set(subject_ids))]).fetchall()}
    new_ids = reopened + [ids[key] for key in keys if key in ids]
    return new_ids, updated


def settle_decision(con: duckdb.DuckDBPyConnection, *, decision_id: int, state: str, error: str | None,
                    attempted_at: dt.datetime | None, settled_at: dt.datetime | None, reason: str, evidence: str) -> None:
    """Record what became of a decision (see ``PolicyEngine._settle``): a skipped or superseded one
    counts no attempt; an executed one keeps the reason and evidence it was carried out with."""
    con.execute(
        """UPDATE decisions SET state = ?, attempts = attempts + ?, last_error = ?,
           attempted_at = coalesce(?::TIMESTAMP, attempted_at),
           executed_at = CASE WHEN ? = 'executed' THEN ?::TIMESTAMP ELSE executed_at END,
           settled_at = ?::TIMESTAMP,
           reason = CASE WHEN ? = 'executed' THEN ? ELSE reason END,
           evidence = CASE WHEN ? = 'executed' THEN ?::JSON ELSE evidence END WHERE id = ?""",
        [state, 0 if state in ("skipped", "superseded") else 1, error, attempted_at, state, attempted_at,
         settled_at, state, reason, state, evidence, decision_id],
    )


def store_verdict(con: duckdb.DuckDBPyConnection, *, machine_id: int, verdict: str, reason: str, now: dt.datetime,
                  expires_s: float | None) -> None:
    """An operator's verdict on a host (``POST /api/v1/hosts/{machine_id}/...``)."""
    con.execute(
        "INSERT INTO host_verdicts VALUES (?, ?, ?, ?, ?::TIMESTAMP + to_seconds(?::DOUBLE))",
        [machine_id, verdict, reason, now, now, expires_s],
    )


def delete_logs(con: duckdb.DuckDBPyConnection, instance_id: str, stream_lines: bool = True) -> int:
    """``stream_lines`` (file mode): the instance's parts of log_stream_lines go with its lines (019, 023)."""
    deleted = con.execute("DELETE FROM logs WHERE instance_id = ?", [instance_id]).fetchone()[0]
    con.execute("DELETE FROM metrics WHERE instance_id = ?", [instance_id])
    if stream_lines:
        con.execute("DELETE FROM log_stream_parts WHERE instance_id = ?", [instance_id])
    return deleted


def recount_stream_lines(con: duckdb.DuckDBPyConnection, instance_ids: list[str] | None = None) -> None:
    """log_stream_lines of ``instance_ids`` (every instance when None) counted again from ``logs`` (every
    instance if the mark had been lost)."""
    if not store.restore_stream_mark(con):
        store.recount_stream_parts(con, instance_ids)


def write_instance_token(con, instance_id: str, token_sha: str, issued_us: int, *, revoke_old: bool) -> None:
    """Store an instance token's digest (the one place that writes token rows; the writer's
    transaction). ``revoke_old``: the instance's earlier tokens are deleted in the same transaction."""
    if revoke_old:
        con.execute("DELETE FROM instance_tokens WHERE instance_id = ?", [instance_id])
    con.execute("INSERT INTO instance_tokens VALUES (?, ?, make_timestamp(?))", [instance_id, token_sha, issued_us])


def store_issued(con, *, issued: dict[str, str], enrolled: list[str], now_us: int) -> None:
    """The tokens a push of registrations issued (instance -> digest), and the enrollments they record,
    in the commit of the registrations' events."""
    for instance_id, token_sha in issued.items():
        write_instance_token(con, instance_id, token_sha, now_us, revoke_old=False)
    if enrolled:
        enrollment.record_enrolled(con, enrolled, now_us)
