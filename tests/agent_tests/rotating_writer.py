"""A daemon that logs fast and has its log rotated twice within a few milliseconds, again and again.

``python rotating_writer.py PATH MODE N GAP_S``: writes N numbered lines to PATH; every 600 lines it
rotates (MODE ``rename``: NAME.k -> NAME.k+1, NAME -> NAME.1, then reopens NAME; ``dateext``:
NAME -> NAME-0001 ...), writes 3 lines to the new file, waits GAP_S, and rotates again: the file in
between is created and rotated away between two polls of the agent.
"""

from __future__ import annotations

import os
import sys
import time


def line(i: int) -> str:
    return f"line {i:05d} of the daemon log, written at a high rate"


def main(path: str, mode: str, n: int, gap_s: float) -> None:
    count = 0

    def rotate(f):
        nonlocal count
        if mode == "rename":
            for k in range(count, 0, -1):
                os.replace(f"{path}.{k}", f"{path}.{k + 1}")
            os.replace(path, f"{path}.1")
        else:
            os.replace(path, f"{path}-{count + 1:04d}")
        count += 1
        f.close()
        return open(path, "ab", buffering=0)

    f = open(path, "ab", buffering=0)
    i = 0
    while i < n:
        burst = min(40, n - i)
        f.write("".join(line(j) + "\n" for j in range(i, i + burst)).encode())
        i += burst
        if i % 600 < 40 and i < n:
            f = rotate(f)
            for _ in range(3):
                if i < n:
                    f.write((line(i) + "\n").encode())
                    i += 1
            time.sleep(gap_s)
            f = rotate(f)
        time.sleep(0.002)
    f.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
