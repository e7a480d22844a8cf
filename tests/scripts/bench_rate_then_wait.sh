#!/bin/sh
# The 5-line benchmark: the rate line (and a line of stderr) before the end, then a wait for GO (60 s at most).
# usage: bench_rate_then_wait.sh GO_FILE
echo "proof 1/2 done in 78.4 s"
echo "proof 2/2 done in 79.1 s"
echo "warning: GPU temperature 81C" >&2
echo "Benchmark result: 45.7 proofs/hour"
i=0
while [ ! -e "$1" ] && [ "$i" -lt 1200 ]; do sleep 0.05; i=$((i + 1)); done
echo "benchmark.sh: done"
