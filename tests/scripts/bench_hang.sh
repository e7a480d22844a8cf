#!/bin/sh
# A benchmark that hangs in a proof (a stuck daemon call), until a signal ends it.
# With "ignore-term" it ignores SIGTERM (so does its child), and only SIGKILL stops it.
# usage: bench_hang.sh DAEMON_LOG READY_FILE [ignore-term]
log=${1:?daemon log} ready=${2:?ready file}
[ "$3" = ignore-term ] && trap '' TERM
echo "Starting benchmark: 12 proofs, concurrency 3, partition-workers 16"
echo "INFO cuzk_daemon::prover: PoRep C2 proof 1/12 started" >> "$log"
echo "waiting for proof 1/12..." >&2
touch "$ready"
sleep 60
echo "not reached"
