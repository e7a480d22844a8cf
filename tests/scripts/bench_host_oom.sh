#!/bin/sh
# A benchmark whose PCE extraction runs the host (not the GPU) out of memory: the container's cgroup
# OOM-kills the daemon (its memory.events' oom_kill rises) and benchmark.sh exits 1 with no rate.
# The kernel's own line goes to dmesg, which the container cannot read: the count is the evidence.
# usage: bench_host_oom.sh DAEMON_LOG CGROUP_DIR
log=${1:?daemon log path}
cgroup=${2:?fake cgroup directory}
echo "Starting benchmark: 12 proofs, concurrency 3, partition-workers 16"
echo "INFO cuzk_daemon::pce: extracting PCE for PoRep 32GiB (warm-up proof)" >> "$log"
printf 'low 0\nhigh 0\nmax 9\noom 3\noom_kill 3\noom_group_kill 0\n' > "$cgroup/memory.events"
echo "cuzk-bench: rpc error: daemon closed the connection" >&2
echo "benchmark.sh exited with error" >&2
exit 1
