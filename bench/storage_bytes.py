"""Bytes on disk per log line, on a corpus with the variety of real daemon logs.

The generator mixes what a proving daemon, its benchmark and the entrypoint print: ISO and
syslog-style timestamps, log levels, Rust module paths, request/proof ids (UUIDs, hex hashes,
CIDs), sector numbers, durations, byte sizes, file paths, gRPC status lines, occasional
multi-field JSON lines and stack-trace frames. Lines go into fleetlog's real ``logs`` table
(ingest/db/store.py's schema, opened through ``store.open_database``) in 100k-row Arrow inserts, one
stream per (instance, source) as the writer stores them, then the file is checkpointed.

Printed, in the same run: the raw text bytes, zstd (level 3) and gzip (level 6) of the same text
as references, then the database's bytes per line with fleetlog's schema (the line column in zstd,
migration 009), with DuckDB's default string compression (the schema before 009) and with
``force_compression = 'zstd'`` on every column; the goal (issue 14) is <= 0.4x the raw text.

    python bench/storage_bytes.py            # BENCH_STORAGE_LINES=1000000
"""

from __future__ import annotations

import gzip
import os
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import duckdb  # noqa: E402
import pyarrow as pa  # noqa: E402

from ingest.db import store  # noqa: E402

LINES = int(os.environ.get("BENCH_STORAGE_LINES", "1000000"))
INSTANCES = 40
SOURCES = ["benchdaemon", "benchout", "setup", "cuzk", "curio"]
LEVELS = ["INFO"] * 12 + ["DEBUG"] * 6 + ["WARN"] * 2 + ["ERROR"]
MODULES = ["cuzk_daemon::prover", "cuzk_daemon::pce", "cuzk_core::gpu::msm", "cuzk_core::synth", "curio::tasks::porep",
           "filecoin_proofs::api::seal", "bellperson::groth16::prover", "storage_proofs_porep::stacked::vanilla::proof",
           "tonic::transport::server", "lotus_api::client"]
PATHS = ["/var/tmp/filecoin-proof-parameters/v28-stacked-proof-of-replication-merkletree-poseidon_hasher-8-8-0-sha256_hasher-{h}.params",
         "/tmp/cuzk-bench-daemon.log", "/data/sealed/s-t0{m}-{n}", "/data/cache/s-t0{m}-{n}/p_aux", "/tmp/cuzk/pce/{h}.bin"]


def _hex(rng: random.Random, n: int) -> str:
    return "%0*x" % (n, rng.getrandbits(4 * n))


def _ts(rng: random.Random, t: float) -> str:
    s = time.gmtime(t)
    return time.strftime("%Y-%m-%dT%H:%M:%S", s) + f".{rng.randint(0, 999999):06d}Z"


def make_line(rng: random.Random, t: float) -> str:
    kind = rng.random()
    ts = _ts(rng, t)
    level = rng.choice(LEVELS)
    module = rng.choice(MODULES)
    sector = rng.randint(1, 9_000_000)
    miner = rng.randint(1000, 4_000_000)
    if kind < 0.25:
        return (f"{ts} {level} {module}: partition {rng.randint(0, 9)} of PoRep C2 proof job={uuid.UUID(int=rng.getrandbits(128))} "
                f"sector={sector} done in {rng.uniform(0.5, 180):.3f}s gpu={rng.randint(0, 7)} mem={rng.randint(1, 80_000)}MiB")
    if kind < 0.40:
        return (f"{ts} {level} {module}: synthesized {rng.randint(1, 2**27):,} constraints for sector {sector} "
                f"(miner f0{miner}) in {rng.randint(10, 90_000)} ms, aux={rng.randint(1, 2**33)} bytes")
    if kind < 0.50:
        path = rng.choice(PATHS).format(h=_hex(rng, 64), m=miner, n=sector)
        return f"{ts} {level} {module}: open {path} ({rng.randint(1, 2**36)} bytes, sha256 {_hex(rng, 64)})"
    if kind < 0.60:
        return (f"{ts} DEBUG tonic::transport::server: request /cuzk.v1.Prover/{rng.choice(['Prove', 'Status', 'Warmup'])} "
                f"from 127.0.0.1:{rng.randint(20000, 65000)} status={rng.choice(['OK', 'OK', 'OK', 'DeadlineExceeded', 'Unavailable'])} "
                f"latency={rng.uniform(0.1, 9000):.1f}ms trace_id={_hex(rng, 32)}")
    if kind < 0.68:
        return (f'{{"ts":"{ts}","level":"{level.lower()}","msg":"task finished","task_id":{rng.randint(1, 10**9)},'
                f'"sp":"f0{miner}","sector":{sector},"cid":"bafy2bzace{_hex(rng, 50)}","took_ms":{rng.randint(1, 10**6)}}}')
    if kind < 0.76:
        return (f"[entrypoint] {time.strftime('%H:%M:%S', time.gmtime(t))} "
                f"{rng.choice(['fetching params', 'benchmark progress', 'daemon health', 'tunnel check'])}: "
                f"{rng.randint(0, 100)}% {rng.randint(1, 60_000)} MiB/s eta {rng.randint(1, 900)}s")
    if kind < 0.82:
        return f"   {rng.randint(0, 40)}: {module}::{rng.choice(['prove', 'synthesize', 'msm_gpu', 'ntt', 'run'])}::h{_hex(rng, 16)}"
    if kind < 0.88:
        return f"      at src/{module.replace('::', '/')}.rs:{rng.randint(1, 3000)}:{rng.randint(1, 80)}"
    if kind < 0.94:
        return (f"proof {rng.randint(1, 12)}/12: ok, duration {rng.uniform(40, 400):.2f} s, "
                f"throughput so far {rng.uniform(0, 60):.2f} proofs/hour, gpu util {rng.randint(0, 100)}% temp {rng.randint(30, 90)}C")
    return (f"{ts} WARN {module}: NVML: gpu {rng.randint(0, 7)} power {rng.uniform(50, 450):.1f} W clocks sm={rng.randint(300, 3000)} "
            f"mem={rng.randint(5000, 12000)} MHz xid={rng.choice([0, 0, 0, 13, 31, 43, 79])} pcie_replay={rng.randint(0, 50)}")


def corpus(n: int) -> pa.Table:
    rng = random.Random(14)
    start = 1_795_000_000.0
    ids, sources, seqs, ts, lines = [], [], [], [], []
    next_seq: dict[tuple[str, str], int] = {}
    t = start
    for _ in range(n):
        instance = f"C.{32733000 + rng.randint(0, INSTANCES - 1)}"
        source = rng.choice(SOURCES)
        key = (instance, source)
        seq = next_seq.get(key, 0)
        next_seq[key] = seq + 1
        t += rng.expovariate(2000)
        ids.append(instance)
        sources.append(source)
        seqs.append(seq)
        ts.append(int(t * 1e6))
        lines.append(make_line(rng, t))
    n = len(lines)
    table = pa.Table.from_arrays(
        [pa.array(ids), pa.array(sources), pa.array(["0"] * n), pa.array(seqs, pa.int64()),
         pa.array(ts, pa.timestamp("us")), pa.array(ts, pa.timestamp("us")), pa.array(lines), pa.array([False] * n)],
        schema=store.LOG_SCHEMA,
    )
    return table.sort_by([("instance_id", "ascending"), ("source", "ascending"), ("seq", "ascending")])


PLAIN_LOGS = """CREATE TABLE logs (instance_id VARCHAR NOT NULL, source VARCHAR NOT NULL, run_id VARCHAR NOT NULL,
    seq BIGINT NOT NULL, ts TIMESTAMP NOT NULL, received_at TIMESTAMP NOT NULL, line VARCHAR NOT NULL,
    truncated BOOLEAN NOT NULL)"""


def _open(path: Path, variant: str) -> duckdb.DuckDBPyConnection:
    if variant == "fleetlog":
        return store.open_database(path)
    config = {"storage_compatibility_version": store.STORAGE_VERSION}  # the same file version as fleetlog's
    if variant == "force_zstd":
        config["force_compression"] = "zstd"
    con = duckdb.connect(str(path), config=config)
    con.execute(PLAIN_LOGS)
    return con


def stored_bytes(table: pa.Table, directory: Path, variant: str) -> int:
    path = directory / f"logs-{variant}.duckdb"
    con = _open(path, variant)
    for start in range(0, table.num_rows, 100_000):
        batch = table.slice(start, 100_000)
        con.register("_b", batch)
        con.execute("INSERT INTO logs SELECT * FROM _b")
        con.unregister("_b")
    con.execute("CHECKPOINT")
    con.close()
    return path.stat().st_size - _empty_size(directory, variant)


def _empty_size(directory: Path, variant: str) -> int:
    path = directory / f"empty-{variant}.duckdb"
    con = _open(path, variant)
    con.execute("CHECKPOINT")
    con.close()
    return path.stat().st_size


def main() -> None:
    table = corpus(LINES)
    text = "\n".join(table.column("line").to_pylist()).encode() + b"\n"
    raw = len(text)
    per_line = raw / table.num_rows
    print(f"corpus: {table.num_rows:,} lines, {raw / 1e6:.1f} MB of text, {per_line:.0f} B/line on average")
    zstd = len(pa.compress(text, codec="zstd", asbytes=True))
    gz = len(gzip.compress(text, 6))
    print(f"reference zstd-3 of the text:  {zstd / table.num_rows:6.1f} B/line  {zstd / raw:.2f}x raw")
    print(f"reference gzip-6 of the text:  {gz / table.num_rows:6.1f} B/line  {gz / raw:.2f}x raw")
    with tempfile.TemporaryDirectory(prefix="fleetlog-storage-") as tmp:
        for variant, label in (("fleetlog", "fleetlog schema (line zstd)"), ("plain", "duckdb default strings"),
                               ("force_zstd", "duckdb force_compression=zstd")):
            size = stored_bytes(table, Path(tmp), variant)
            print(f"{label:<30} {size / table.num_rows:6.1f} B/line  {size / raw:.2f}x raw  "
                  f"{size / zstd:.2f}x zstd  goal <= 0.40x raw: {'met' if size / raw <= 0.4 else 'NOT met'}")


if __name__ == "__main__":
    main()
