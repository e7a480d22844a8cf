"""The project as others install it: a wheel that works outside the repository, and lean extras.

The wheel is built offline (``--no-build-isolation``, with the setuptools of the test extra) from a
copy of the tracked files, installed with ``--no-deps`` into a fresh venv that borrows the running
interpreter's site-packages for the dependencies (a ``.pth`` path, so not the editable install of
this checkout), and run from a directory that is not the repository.
"""

from __future__ import annotations

import email
import os
import shutil
import site
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO, free_port, stop_group

pytestmark = pytest.mark.slow


def run(*argv, cwd=None, env=None, timeout=300) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout,
                          start_new_session=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> tuple[Path, str]:
    """The built wheel and what the build printed."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "src"
    tracked = run("git", "ls-files", "-co", "--exclude-standard", cwd=REPO).stdout.split()
    for name in tracked:
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    built = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", tmp / "dist", source,
                "-v", cwd=tmp)
    (path,) = (tmp / "dist").glob("fleetlog-*.whl")
    return path, built.stdout + built.stderr


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv holding only the wheel; the dependencies come from this interpreter's site-packages."""
    venv = tmp_path_factory.mktemp("venv")
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    purelib = Path(run(venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").stdout.strip())
    (purelib / "_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    run(sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "--no-deps", "--no-index", wheel[0])
    return venv


def test_the_build_warns_about_nothing(wheel):
    _, output = wheel
    noise = "byte-compiling is disabled"  # distutils' note when PYTHONDONTWRITEBYTECODE is set
    warnings = [line for line in output.splitlines() if "warning" in line.lower() and noise not in line]
    assert warnings == []


def test_the_wheel_carries_the_queries_migrations_and_page(wheel):
    names = set(zipfile.ZipFile(wheel[0]).namelist())
    for name in ("queries/why_failed.sql", "queries/hosts.sql", "queries/policies/10_failure_class.sql",
                 "ingest/db/migrations/001_initial.sql", "ingest/web/static/index.html", "ingest/web/static/app.js"):
        assert name in names, name
    assert not any(n.startswith(("tests/", "bench/", "docker/")) for n in names)


def test_the_agent_extra_brings_no_duckdb_or_arrow(wheel):
    with zipfile.ZipFile(wheel[0]) as z:
        meta = email.message_from_bytes(z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))))
    requires = meta.get_all("Requires-Dist")
    base = [r for r in requires if "extra ==" not in r]
    for heavy in ("duckdb", "pyarrow", "grpcio", "prometheus-client"):
        assert not any(r.startswith(heavy) for r in base), base
        assert any(r.startswith(heavy) and 'extra == "server"' in r for r in requires), heavy
    assert "agent" in meta.get_all("Provides-Extra") and "server" in meta.get_all("Provides-Extra")
    # and the agent runs with duckdb and pyarrow out of reach
    blocker = ("import sys\nclass Block:\n    def find_spec(self, name, path=None, target=None):\n"
               "        if name.split('.')[0] in ('duckdb', 'pyarrow', 'grpc', 'prometheus_client'):\n"
               "            raise ImportError(name + ' is blocked')\nsys.meta_path.insert(0, Block())\n"
               "import pkgutil, agent, importlib\n"
               "for m in pkgutil.iter_modules(agent.__path__): importlib.import_module('agent.' + m.name)\n"
               "from agent.cli import main\nsys.argv = ['fleetlog-agent', '--help']\nmain()\n")
    proc = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0 and "usage" in proc.stdout, proc.stderr


def test_the_installed_wheel_serves_and_queries_from_any_directory(installed, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETLOG_", "PYTHON"))}
    where = run(installed / "bin" / "python", "-c", "import ingest, queries; print(ingest.__file__, queries.__file__)",
                cwd=tmp_path, env=env).stdout
    assert str(REPO) not in where and str(installed) in where, where
    db = tmp_path / "offline.duckdb"
    fleetlog = installed / "bin" / "fleetlog"
    run(fleetlog, "policy", "run", "--once", "--db", db, cwd=tmp_path, env=env)  # the rules come from the wheel
    offline = run(fleetlog, "query", "--db", db, "--file", "machine_leaderboard", cwd=tmp_path, env=env)
    assert "(0 rows)" in offline.stdout
    port = free_port()
    with (tmp_path / "serve.log").open("wb") as log:
        server = subprocess.Popen([fleetlog, "serve", "--port", str(port), "--db", tmp_path / "served.duckdb",
                                   "--otlp-grpc-port", "0"], cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
                    assert b"/static/app.js" in r.read()
                break
            except OSError:
                assert server.poll() is None, (tmp_path / "serve.log").read_text()
                assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
                time.sleep(0.2)
        hosts = run(fleetlog, "query", "--server", f"http://127.0.0.1:{port}", "--file", "hosts", "--format", "csv",
                    cwd=tmp_path, env=env)
        assert hosts.stdout.startswith("machine_id,")
    finally:
        stop_group(server)
