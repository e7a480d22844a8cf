"""``make test`` does every set-up step: scripts/test-deps.sh installs (as root) or names (otherwise) what is missing."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "test-deps.sh"


@pytest.fixture
def bin_dir():
    """``bin_dir(*present)``: a PATH holding what the script itself runs, plus fake commands named
    ``present``; readable by the unprivileged user the script runs as (tmp_path is not)."""
    made: list[Path] = []

    def make(*present: str) -> Path:
        path = Path(tempfile.mkdtemp(prefix="fleetlog-test-deps-"))
        path.chmod(0o755)
        made.append(path)
        return fill(path, *present)

    yield make
    for path in made:
        shutil.rmtree(path)


def fill(path: Path, *present: str) -> Path:
    (path / "bash").symlink_to(shutil.which("bash"))
    for tool in ("python3", *present):  # python3 that has venv: the interpreter here may not be reachable
        (path / tool).write_text("#!/bin/sh\nexit 0\n")
        (path / tool).chmod(0o755)
    return path


def run_unprivileged(path: Path) -> subprocess.CompletedProcess:
    argv = [str(path / "bash"), str(SCRIPT)]
    if os.geteuid() == 0:  # as nobody: the script must not try to install
        argv = [shutil.which("setpriv"), "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env={"PATH": str(path)},
                          start_new_session=True)


def test_not_as_root_it_names_the_missing_packages_and_stops(bin_dir):
    proc = run_unprivileged(bin_dir())
    assert proc.returncode == 1
    assert "apt-get install -y --no-install-recommends prometheus shellcheck podman runc debootstrap" in proc.stderr
    assert "apt-get install -y chromium" in proc.stderr  # with its recommends: the fonts


def test_with_everything_there_it_does_nothing(bin_dir):
    proc = run_unprivileged(bin_dir("promtool", "shellcheck", "chromium", "podman", "runc", "debootstrap"))
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def test_ci_runs_only_make_test_and_make_test_runs_the_script():
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == "make test" and not any("apt-get" in line for line in ci)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}  # make test runs us
    make = subprocess.run(["make", "--no-print-directory", "-n", "test"], capture_output=True, text=True, cwd=REPO,
                          timeout=60, env=env)
    assert make.stdout.splitlines()[0] == "scripts/test-deps.sh", make.stdout


def test_the_script_passes_shellcheck():
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.fail("shellcheck is not installed: make test installs it (scripts/test-deps.sh)")
    proc = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout


def make_dry_run(target: str, venv: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    proc = subprocess.run(["make", "--no-print-directory", "-n", f"VENV={venv}", target], capture_output=True, text=True,
                          cwd=REPO, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_make_run_installs_only_the_server_extra_and_make_test_the_test_extra(tmp_path):
    run = make_dry_run("run", tmp_path / "venv")
    assert "-e '.[server]'" in run and ".[test]" not in run, run
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / ".installed-server").touch()  # `make run` was done: `make test` still installs the test extra
    test = make_dry_run("test", tmp_path / "venv")
    assert "-e '.[test]'" in test, test
    for stamp in (".installed-test", ".installed-server"):  # what `make test` leaves: `make run` needs nothing more
        (tmp_path / "venv" / stamp).touch()
    assert "pip install" not in make_dry_run("run", tmp_path / "venv")
