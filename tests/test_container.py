"""The images, built and run for real with podman (or docker): the ingest image serves with tokens on,
the agent image's entrypoint runs an instance's whole lifecycle against it with tests/scripts'
stand-ins for the parameter fetch, the benchmark and the daemons, and everything is checked through
the API. Without a container registry the images are built from a local debootstrap base
(docker/build-images.sh); the base tarball and the image layers are cached between runs.

Skipped, with the reason, where no engine can run containers (not root and no user namespaces, or
nothing installed: scripts/container-deps.sh installs it as root); with CI=1 that is a failure."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import orjson
import pytest
from playwright.sync_api import expect, sync_playwright

from tests.conftest import REPO, free_port

pytestmark = pytest.mark.container

SCRIPTS = REPO / "tests" / "scripts"
TAG = "test"
VERSION = "0.1.0+container-test"
CHROMIUM = os.environ.get("FLEETLOG_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
TOKENS = {"enroll": "ctr-enroll-token", "read": "ctr-read-token", "admin": "ctr-admin-token"}
BUILD_TIMEOUT_S = 1800  # a cold cache: debootstrap, apt, pip downloads; a warm one takes seconds


def unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"container test cannot run in CI: {reason}")
    pytest.skip(reason)


def engine_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, **extra)
    if "CONTAINERS_CONF" not in env and shutil.which("runc"):
        env["CONTAINERS_CONF"] = str(REPO / "docker" / "podman-containers.conf")  # as build-images.sh does
    return env


def run(*args: str, timeout_s: float = 120, check: bool = True, out: Path | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """A command in its own process group, killed with its group when it overruns."""
    sink = out.open("ab") if out is not None else subprocess.PIPE
    try:
        proc = subprocess.Popen(args, stdout=sink, stderr=subprocess.STDOUT if out else subprocess.PIPE,
                                env=engine_env(**(env or {})), start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise AssertionError(f"{' '.join(args)}: still running after {timeout_s} s") from None
    finally:
        if out is not None:
            sink.close()
    result = subprocess.CompletedProcess(args, proc.returncode, (stdout or b"").decode(errors="replace"),
                                         (stderr or b"").decode(errors="replace"))
    if check and result.returncode != 0:
        detail = out.read_text(errors="replace")[-4000:] if out else result.stdout[-2000:] + result.stderr[-2000:]
        raise AssertionError(f"{' '.join(args)}: exit {result.returncode}\n{detail}")
    return result


def find_engine() -> str:
    """The engine to use, or a skip (a failure with CI=1) that says why none can run here."""
    wanted = os.environ.get("CONTAINER_ENGINE")
    engine = wanted or next((e for e in ("podman", "docker") if shutil.which(e)), None)
    if engine is None or shutil.which(engine) is None:
        unavailable("neither podman nor docker is installed (as root, scripts/container-deps.sh installs podman)")
    if Path(engine).name == "podman" and os.geteuid() != 0:
        userns = Path("/proc/sys/user/max_user_namespaces")
        if userns.exists() and userns.read_text().strip() == "0":
            unavailable("podman as a user needs user namespaces, and user.max_user_namespaces is 0")
        if shutil.which("newuidmap") is None:
            unavailable("podman as a user needs newuidmap (apt-get install uidmap)")
    info = run(engine, "info", timeout_s=120, check=False)
    if info.returncode != 0:
        last = (info.stderr.strip() or info.stdout.strip()).splitlines()[-1:] or ["no output"]
        unavailable(f"{engine} cannot run containers here: {last[0]}")
    return engine


@pytest.mark.parametrize("ci", ["", "1"])
def test_without_a_working_engine_the_test_says_why_and_fails_in_ci(monkeypatch, tmp_path, ci):
    broken = tmp_path / "podman"
    broken.write_text("#!/bin/sh\necho 'Error: cannot clone: Operation not permitted' >&2\nexit 125\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CONTAINER_ENGINE", str(broken))
    monkeypatch.setenv("CI", ci)
    with pytest.raises((pytest.fail.Exception if ci else pytest.skip.Exception)) as stopped:
        find_engine()
    assert "cannot clone: Operation not permitted" in str(stopped.value) or "user namespaces" in str(stopped.value)


def wait_for(predicate, what: str, timeout_s: float = 300, every_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last: {last!r})"[:3000])


class Api:
    def __init__(self, url: str) -> None:
        self.url = url

    def call(self, path: str, token: str, method: str = "GET", body: dict | None = None):
        data = orjson.dumps(body) if body is not None else b"" if method == "POST" else None
        request = urllib.request.Request(self.url + path, method=method, data=data,
                                         headers={"Authorization": f"Bearer {TOKENS[token]}"})
        with urllib.request.urlopen(request, timeout=30) as r:
            return orjson.loads(r.read())

    def get(self, path: str):
        return self.call(path, "read")

    def instance(self, instance_id: str):
        try:
            return self.get(f"/api/v1/instances/{instance_id}")
        except urllib.error.HTTPError as e:
            if e.code == 404:  # not registered yet
                return None
            raise
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return None

    def lines(self, instance_id: str, source: str) -> list[str]:
        body = self.get(f"/api/v1/instances/{instance_id}/logs?source={source}&tail=10000")
        return [line["line"] for line in body["lines"]]


@pytest.fixture(scope="module")
def engine() -> str:
    return find_engine()


@pytest.fixture(scope="module")
def images(engine, tmp_path_factory) -> dict[str, str]:
    log = tmp_path_factory.mktemp("images") / "build.log"
    started = time.monotonic()
    try:
        run(str(REPO / "docker" / "build-images.sh"), timeout_s=BUILD_TIMEOUT_S, out=log,
            env={"CONTAINER_ENGINE": engine, "FLEETLOG_IMAGE_TAG": TAG, "FLEETLOG_IMAGE_VERSION": VERSION})
    except AssertionError as e:
        if "debootstrap needs root" in str(e):  # no registry, no cached base, and not root
            unavailable("no container registry answers and making a Debian base (debootstrap) needs root")
        raise
    print(f"images built in {time.monotonic() - started:.1f} s (log {log})")
    return {"ingest": f"fleetlog-ingest:{TAG}", "agent": f"fleetlog-agent:{TAG}"}


class Containers:
    """Containers this test started, each removed (with its volumes) at the end whatever happens."""

    def __init__(self, engine: str) -> None:
        self.engine = engine
        self.names: list[str] = []
        self.prefix = f"fleetlog-test-{uuid.uuid4().hex[:8]}"

    def start(self, role: str, image: str, *args: str, env: dict[str, str], volumes: tuple[str, ...] = ()) -> str:
        name = f"{self.prefix}-{role}"
        flags = [f"--env={k}={v}" for k, v in env.items()] + [f"--volume={v}" for v in volumes]
        run(self.engine, "run", "--detach", "--name", name, "--network=host", "--health-cmd=none", *flags, image, *args,
            timeout_s=120)
        self.names.append(name)
        return name

    def state(self, name: str) -> dict:
        out = run(self.engine, "inspect", "--format", "{{json .State}}", name).stdout
        return orjson.loads(out)

    def exit_code(self, name: str, timeout_s: float = 300) -> int:
        state = wait_for(lambda: (s := self.state(name)) and not s["Running"] and s, f"{name} to exit", timeout_s)
        return state["ExitCode"]

    def logs(self, name: str) -> str:
        done = run(self.engine, "logs", name, check=False)
        return done.stdout + done.stderr

    def remove_all(self) -> None:
        for name in self.names:
            run(self.engine, "rm", "--force", "--volumes", name, timeout_s=120, check=False)


@pytest.fixture(scope="module")
def fleet(engine, images):
    """The ingest image serving on a free loopback port (host network), tokens on."""
    containers = Containers(engine)
    port, grpc_port = free_port(), free_port()
    env = {"FLEETLOG_PORT": str(port), "FLEETLOG_OTLP_GRPC_PORT": str(grpc_port), "FLEETLOG_POLICY_INTERVAL_S": "0",
           "FLEETLOG_ENROLL_TOKEN": TOKENS["enroll"], "FLEETLOG_READ_TOKEN": TOKENS["read"],
           "FLEETLOG_ADMIN_TOKEN": TOKENS["admin"]}
    try:
        ingest = containers.start("ingest", images["ingest"], env=env)
        api = Api(f"http://127.0.0.1:{port}")

        def ready():
            if not containers.state(ingest)["Running"]:
                raise AssertionError(f"the ingest container exited:\n{containers.logs(ingest)[-3000:]}")
            try:
                with urllib.request.urlopen(api.url + "/readyz", timeout=5) as r:
                    return r.status == 200
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                return False

        wait_for(ready, "the ingest container's /readyz", timeout_s=180)
        yield containers, api
    finally:
        containers.remove_all()


def agent_env(server: str, instance: str, **extra: str) -> dict[str, str]:
    return {
        "FLEETLOG_SERVER": server,
        "FLEETLOG_INSTANCE_ID": instance,
        "FLEETLOG_ENROLL_TOKEN": TOKENS["enroll"],
        "FLEETLOG_MACHINE_ID": "55891",
        "FLEETLOG_HOST_ID": "7140",
        "FLEETLOG_LOCATION": "Norway",
        "FLEETLOG_GPU_MODEL": "RTX 4090",
        "FLEETLOG_PARAMS_CMD": "/opt/standins/standin_params.sh",
        "FLEETLOG_BENCH_CMD": "/opt/standins/standin_benchmark.sh",
        "FLEETLOG_DAEMON_CMD": "/opt/standins/standin_daemon.sh cuzk-daemon",
        "FLEETLOG_CURIO_CMD": "/opt/standins/standin_daemon.sh curio",
        "BENCH_PROOFS": "3",
        "FLEETLOG_AGENT_FLUSH_TIMEOUT_S": "60",
        **extra,
    }


def start_agent(containers: Containers, api: Api, images, instance: str, **extra: str) -> str:
    return containers.start(instance.lower().replace(".", "-"), images["agent"], env=agent_env(api.url, instance, **extra),
                            volumes=(f"{SCRIPTS}:/opt/standins:ro",))


def test_images_carry_their_version_the_healthcheck_and_no_server_in_the_agent(engine, images):
    for image in images.values():
        inspected = orjson.loads(run(engine, "image", "inspect", image).stdout)[0]
        config = inspected.get("Config") or {}
        labels = config.get("Labels") or inspected.get("Labels") or {}
        assert labels.get("org.opencontainers.image.version") == VERSION, labels
    ingest = orjson.loads(run(engine, "image", "inspect", images["ingest"]).stdout)[0]
    health = (ingest.get("Config") or {}).get("Healthcheck") or ingest.get("Healthcheck")
    assert health and "/readyz" in " ".join(health["Test"]), ingest.get("Config")  # podman keeps it with --format docker
    probe = run(engine, "run", "--rm", "--network=none", "--entrypoint", "python3.11", images["agent"], "-c",
                "import importlib.util as u, os; print([m for m in ('duckdb', 'pyarrow', 'ingest', 'agent.cli') if u.find_spec(m)],"
                " os.environ['FLEETLOG_IMAGE_VERSION'])", timeout_s=120)
    assert probe.stdout.split() == ["['agent.cli']", VERSION], probe.stdout + probe.stderr


def test_an_instance_lifecycle_in_containers(fleet, images):
    containers, api = fleet
    agent = start_agent(containers, api, images, "C.1001")

    def running():
        detail = api.instance("C.1001")
        if detail is None:
            return None
        if not containers.state(agent)["Running"]:
            raise AssertionError(f"the agent container exited early:\n{containers.logs(agent)[-3000:]}")
        return detail["state"] == "running" and {"cuzk", "curio"} <= set(detail["logs"]) and detail

    detail = wait_for(running, "C.1001 to reach 'running' with the daemons' logs")
    kinds = [e["kind"] for e in detail["events"] if e["kind"] not in ("logs_complete", "gpu_state")]
    assert kinds == ["registered", "params_done", "bench_started", "bench_done", "running"], kinds
    [registered] = [e for e in detail["events"] if e["kind"] == "registered"]
    assert registered["body"]["labels"] == {"image_version": VERSION}
    assert detail["gpu_model"] == "RTX 4090" and detail["machine_id"] == 55891 and detail["location"] == "Norway"
    assert detail["bench"]["exit_code"] == 0 and detail["bench"]["rate_per_hour"] == 41.7

    run(containers.engine, "stop", "--time", "120", agent, timeout_s=300)  # SIGTERM to the entrypoint
    assert containers.exit_code(agent) == 0, containers.logs(agent)[-3000:]
    sources = ("setup", "benchout", "benchdaemon", "benchresults", "cuzk", "curio", "entrypoint")

    def all_complete():
        logs = api.instance("C.1001")["logs"]
        return all(logs.get(s, {}).get("complete") is True for s in sources) and logs

    logs = wait_for(all_complete, "every source of C.1001 to be complete", timeout_s=120)
    assert all(logs[s]["gaps"] == [] for s in sources), logs
    assert api.lines("C.1001", "benchresults") == [f"proof {i}/3: 141.0 s" for i in (1, 2, 3)]
    cuzk = api.lines("C.1001", "cuzk")
    assert cuzk[0].startswith("cuzk-daemon: started") and cuzk[-1] == "cuzk-daemon: stopping on SIGTERM"
    own = api.lines("C.1001", "entrypoint")
    assert "registering C.1001" in own[0] and VERSION in own[0] and "stopping: daemons first" in own[-1], own

    # the page, served by the ingest image, says which image the instance ran
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"no Chromium at {CHROMIUM}: apt-get install chromium (or set FLEETLOG_CHROMIUM)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.add_init_script(f"localStorage.setItem('fleetlog.token', {TOKENS['read']!r})")
            page.goto(api.url + "/#/instance/C.1001")
            fact = page.locator("dl.facts div", has=page.locator("dt", has_text="image")).locator("dd")
            expect(fact).to_have_text(VERSION, timeout=30_000)
        finally:
            browser.close()


def test_a_failing_benchmark_in_containers_is_classified_and_its_destroy_proposed(fleet, images):
    containers, api = fleet
    api.call("/api/v1/admin/instances", "admin", method="POST", body={"instance_ids": ["C.1002"]})  # the deployer's step
    agent = start_agent(containers, api, images, "C.1002", STANDIN_BENCH="oom")
    assert containers.exit_code(agent) == 1, containers.logs(agent)[-3000:]
    detail = wait_for(lambda: (d := api.instance("C.1002")) and d["logs"].get("entrypoint", {}).get("complete") and d,
                      "C.1002's own lines to be complete", timeout_s=120)
    assert "running" not in [e["kind"] for e in detail["events"]]
    for source in ("setup", "benchout", "benchdaemon", "benchresults", "entrypoint"):
        assert detail["logs"][source]["complete"] is True, (source, detail["logs"][source])
    assert detail["bench"]["exit_code"] == 1 and "out of memory" in detail["bench"]["failure_excerpt"], detail["bench"]

    api.call("/api/v1/policy/run", "admin", method="POST")  # the rules classify, then decide
    bench = api.instance("C.1002")["bench"]
    assert bench["failure_class"] == "oom" and "out of memory" in bench["failure_line"], bench
    destroys = api.call("/api/v1/decisions?action=destroy&subject=C.1002", "admin")["decisions"]
    assert [d["state"] for d in destroys] == ["proposed"], destroys
    assert destroys[0]["evidence"]["failure_class"] == "oom"


def test_container_deps_lists_what_is_missing(tmp_path):
    bin_dir = tmp_path / "bin"  # a PATH with bash and coreutils only: podman, runc, debootstrap missing
    bin_dir.mkdir()
    for tool in ("bash", "env"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    proc = subprocess.run([str(bin_dir / "bash"), str(REPO / "scripts" / "container-deps.sh"), "--check"],
                          env={"PATH": str(bin_dir)}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "missing: podman runc debootstrap" in proc.stderr, proc.stderr
