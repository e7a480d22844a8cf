#!/bin/sh
# A benchmark that passes at a given rate: N proofs, then the rate line.
# usage: bench_rate.sh DAEMON_LOG RATE [PROOFS]
log=${1:?daemon log path} rate=${2:?proofs/hour}
proofs=${3:-3}
echo "Starting benchmark: $proofs proofs, concurrency 3, partition-workers 16"
echo "cuzk-daemon: listening on 127.0.0.1:9820" >> "$log"
i=1
while [ "$i" -le "$proofs" ]; do
    echo "INFO cuzk_daemon::prover: PoRep C2 proof $i/$proofs finished" >> "$log"
    echo "proof $i/$proofs done"
    i=$((i + 1))
done
echo "Throughput: $rate proofs/hour"
exit 0
