"""The fleet simulation, longer: N real instances (docker/entrypoint.sh, mixed fates) under a server
SIGKILLed and restarted, a network cut, rotations and restarted agents (tests/fleetsim.py), then the
decision latency (logs_complete stored -> the actuator ran, by its own clock) as a ratio to the policy
interval (issue 21's goal: p99 <= 2 intervals), with a small fleet's latency (12 instances, no faults) measured in the same run as the reference
(what the engine costs without the load of N instances on this host). Each run also prints where
its latency went (tests/fleetsim.py's ``breakdown``: evidence -> decided -> actuator, the server's
downtime inside it, the policy runs' and rules' seconds).

    BENCH_FLEET_N=40 BENCH_FLEET_MACHINES=18 BENCH_FLEET_INTERVAL_S=1 python bench/fleet_sim.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import fleetsim  # noqa: E402


def main() -> int:
    n = int(os.environ.get("BENCH_FLEET_N", "40"))
    machines = int(os.environ.get("BENCH_FLEET_MACHINES", "18"))
    interval_s = float(os.environ.get("BENCH_FLEET_INTERVAL_S", "1"))
    results = {}
    for label, size, kills, cut_s in (("reference", 12, 0, 0.0), ("fleet", n, 2, 10.0)):
        with tempfile.TemporaryDirectory(prefix=f"fleet-sim-{label}-") as d:
            r = fleetsim.run(Path(d), n=size, machines=min(machines, size), interval_s=interval_s, server_kills=kills,
                             cut_s=cut_s, deadline_s=900)
        results[label] = r
        print(f"{label}: {size} instances, {r['lines_written']} lines written, {r['lost']} lost, {r['doubled']} doubled, "
              f"{r['destroyed']}/{r['expected_destroyed']} destroyed, {r['healthy_destroyed']} healthy destroyed, "
              f"latency p50 {r['latency_p50_s']:.2f} s p99 {r['latency_p99_s']:.2f} s max {r['latency_max_s']:.2f} s, "
              f"without the {r['latencies_with_restart']} of {r['latencies']} holding a server restart p50 "
              f"{r['latency_p50_no_restart_s']:.2f} s p99 {r['latency_p99_no_restart_s']:.2f} s, "
              f"from all the evidence held (logs complete and the outcome known) p50 {r['evidence_latency_p50_s']:.2f} s "
              f"p99 {r['evidence_latency_p99_s']:.2f} s, {r['elapsed_s']:.0f} s in all; problems: {r['problems'] or 'none'}", flush=True)
        print(f"{label}: where the latency went: {json.dumps(r['breakdown'])}", flush=True)
    fleet, ref = results["fleet"], results["reference"]
    print(f"decision latency p99 / policy interval: {fleet['latency_p99_s'] / interval_s:.1f}x (goal <= 2x); "
          f"from all the evidence held: {fleet['evidence_latency_p99_s'] / interval_s:.1f}x; "
          f"p99 / the 12-instance reference's p99: {fleet['latency_p99_s'] / ref['latency_p99_s']:.1f}x; "
          f"load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(json.dumps({k: {x: v for x, v in r.items() if x != "log"} for k, r in results.items()}, default=str))
    return 0 if not (fleet["problems"] or ref["problems"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
