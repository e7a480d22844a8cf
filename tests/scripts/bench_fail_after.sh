#!/bin/sh
# A benchmark that completes some proofs, then fails: the daemon and benchmark.sh both say each proof.
# usage: bench_fail_after.sh DAEMON_LOG DONE PROOFS
log=${1:?daemon log path}
done_n=${2:?proofs that complete}
proofs=${3:?proofs}
echo "Starting benchmark: $proofs proofs, concurrency 3, partition-workers 16"
i=1
while [ "$i" -le "$done_n" ]; do
    echo "INFO cuzk_daemon::prover: PoRep C2 proof $i/$proofs started" >> "$log"
    echo "INFO cuzk_daemon::prover: PoRep C2 proof $i/$proofs: 10 partitions done in 141.0 s" >> "$log"
    echo "proof $i/$proofs done in 141.0 s"
    i=$((i + 1))
done
echo "INFO cuzk_daemon::prover: PoRep C2 proof $i/$proofs started" >> "$log"
echo "ERROR cuzk_daemon::prover: proof $i/$proofs failed: CUDA error: an illegal memory access was encountered" >> "$log"
echo "proof $i/$proofs failed"
echo "benchmark.sh exited with error" >&2
exit 1
