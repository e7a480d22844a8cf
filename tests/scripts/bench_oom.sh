#!/bin/sh
# A benchmark that fails the way the incident's did: the daemon runs out of GPU memory while it
# extracts the PCE during the warm-up proof, and benchmark.sh exits 1 with no rate.
# usage: bench_oom.sh DAEMON_LOG
log=${1:?daemon log path}
echo "Starting benchmark: 12 proofs, concurrency 3, partition-workers 16"
echo "cuzk-daemon: listening on 127.0.0.1:9820" >> "$log"
echo "INFO cuzk_daemon::pce: extracting PCE for PoRep 32GiB (warm-up proof)" >> "$log"
echo "INFO cuzk_daemon::pce: allocating 21.4 GiB on device 0 (NVIDIA RTX PRO 4000 Blackwell)" >> "$log"
echo "ERROR cuzk_daemon::pce: CUDA error: out of memory (cudaErrorMemoryAllocation) during PCE extraction" >> "$log"
printf 'thread main panicked at cuzk-core/src/pce.rs:211: PCE extraction failed' >> "$log"
echo "waiting for warm-up proof..."
echo "cuzk-bench: rpc error: daemon closed the connection" >&2
echo "benchmark.sh exited with error" >&2
exit 1
