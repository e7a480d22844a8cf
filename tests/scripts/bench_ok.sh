#!/bin/sh
# A benchmark that succeeds: the daemon log fills up while proofs run, then the rate line.
# usage: bench_ok.sh DAEMON_LOG [PROOFS]
log=${1:?daemon log path}
proofs=${2:-3}
echo "Starting benchmark: $proofs proofs, concurrency 3, partition-workers 16"
echo "cuzk-daemon: listening on 127.0.0.1:9820" >> "$log"
i=1
while [ "$i" -le "$proofs" ]; do
    echo "INFO cuzk_daemon::prover: PoRep C2 proof $i/$proofs started" >> "$log"
    echo "proof $i/$proofs done in 138.2 s"
    echo "INFO cuzk_daemon::prover: PoRep C2 proof $i/$proofs finished" >> "$log"
    i=$((i + 1))
done
echo "warning: GPU temperature 81C" >&2
echo "Throughput: 42.5 proofs/hour"
exit 0
