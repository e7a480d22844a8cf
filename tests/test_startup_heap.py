"""The objects alive after start-up are left out of the garbage collector's passes (``budget.freeze_startup_heap``).

A full pass walks every tracked object with the GIL held: while 2 M lines came in, a real server made 11 of
them at 37-46 ms each, each one stopping the event loop and the writer (a first tail's whole budget is 10 ms).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PROBE = r"""
import gc, sys
from ingest import budget
from ingest import app  # what a server imports
startup = [[i] for i in range(200_000)]  # tracked objects alive at start-up (as the stream index is)
frozen = budget.freeze_startup_heap()
walked = len(gc.get_objects())  # what a full pass walks now
class Cycle: pass
a, b = Cycle(), Cycle()
a.other, b.other = b, a  # garbage made after start-up is still collected
del a, b
collected = gc.collect()
print(frozen, walked, collected)
"""


def test_a_full_collection_no_longer_walks_what_start_up_left():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, cwd=REPO,
                         start_new_session=True)
    assert out.returncode == 0, out.stderr
    frozen, walked, collected = map(int, out.stdout.split())
    assert frozen >= 200_000, frozen  # the start-up objects and the modules'
    assert walked < 10_000, walked  # before the freeze a full pass walked them all (> 200,000)
    assert collected >= 2, collected


def test_the_server_freezes_its_heap_once_started(server_process, tmp_path):
    server = server_process().start()
    found = server.wait_for_log(r"start-up heap frozen: (\d+) objects")
    assert int(found.group(1)) > 20_000  # the modules alone (67 k in bench/vs_victorialogs.py's server)
    with __import__("urllib.request").request.urlopen(server.url + "/readyz", timeout=10) as r:
        assert r.status == 200
