#!/bin/sh
# A benchmark that takes a while: N lines to stdout and to the daemon log, a pause every 50.
# Each start is recorded in MARKER (a restarted agent must not start it again); "finished" at the end.
# usage: bench_slow.sh DAEMON_LOG N MARKER
log=${1:?daemon log} n=${2:?line count} marker=${3:?marker file}
echo started >> "$marker"
i=1
while [ "$i" -le "$n" ]; do
    echo "proof progress line $i of $n"
    echo "INFO cuzk_daemon::prover: partition $i of $n synthesized" >> "$log"
    if [ $((i % 50)) -eq 0 ]; then sleep 0.05; fi
    i=$((i + 1))
done
echo "Throughput: 42.5 proofs/hour"
echo finished >> "$marker"
