"""What the input bounds cost: HTTP ingest lines/s of this tree against a base ref (default main),
measured in the same run, alternating A B A B, with ``bench/ingest_throughput.py`` in each tree.
Target: this tree >= 0.90x the base.

    python bench/hardening_cost.py [BASE_REF]      # ROUNDS=2 BENCH_LINES=200000 BENCH_CONCURRENCY=8
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RATE = re.compile(r"fleetlog\s+HTTP ingest.*?([\d,]+) lines/s")


def rate(tree: Path) -> float:
    env = dict(os.environ, BENCH_LINES=os.environ.get("BENCH_LINES", "200000"))
    out = subprocess.run([sys.executable, "bench/ingest_throughput.py"], cwd=tree, env=env, capture_output=True, text=True,
                         timeout=1200, check=True).stdout
    match = RATE.search(out)
    if match is None:
        raise RuntimeError(out)
    return float(match.group(1).replace(",", ""))


def main() -> None:
    base = sys.argv[1] if len(sys.argv) > 1 else "main"
    rounds = int(os.environ.get("ROUNDS", "2"))
    with tempfile.TemporaryDirectory(prefix="fleetlog-base-") as tmp:
        tree = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), base], cwd=REPO, check=True, capture_output=True)
        try:
            before, after = [], []
            for _ in range(rounds):
                before.append(rate(tree))
                after.append(rate(REPO))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=False, capture_output=True)
    b, a = statistics.median(before), statistics.median(after)
    print(f"{base}: {', '.join(f'{r:,.0f}' for r in before)} lines/s (median {b:,.0f})")
    print(f"this tree: {', '.join(f'{r:,.0f}' for r in after)} lines/s (median {a:,.0f})")
    print(f"ratio this tree / {base} = {a / b:.2f}  (target >= 0.90)")


if __name__ == "__main__":
    main()
