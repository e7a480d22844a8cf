"""The ingest image built with the lake extra (``FLEETLOG_INGEST_EXTRA=lake docker/build-images.sh``)
runs ``fleetlog serve --lake``: two containers on one PostgreSQL and one lake directory, tokens on, a
plain-text push sent to the node that does not own the instance lands once, read back from the other."""

from __future__ import annotations

import urllib.error
import urllib.request
import uuid

import orjson
import pytest

from ingest.db.lake.slots import slot_of
from tests.conftest import REPO, free_port
from tests.lake_pg import postgres  # noqa: F401 (a fixture)
from tests.test_container import BUILD_TIMEOUT_S, TOKENS, VERSION, Containers, find_engine, run, wait_for
from tests.test_lake_forward import log_push, slot_owners
from tests.test_lake_nodes import owners

pytestmark = [pytest.mark.container, pytest.mark.lake]

TAG = "lake-test"


@pytest.fixture(scope="module")
def lake_image(tmp_path_factory) -> tuple[str, str]:
    engine = find_engine()
    log = tmp_path_factory.mktemp("lake-image") / "build.log"
    run(str(REPO / "docker" / "build-images.sh"), timeout_s=BUILD_TIMEOUT_S, out=log,
        env={"CONTAINER_ENGINE": engine, "FLEETLOG_IMAGES": "ingest", "FLEETLOG_INGEST_EXTRA": "lake",
             "FLEETLOG_IMAGE_TAG": TAG, "FLEETLOG_IMAGE_VERSION": VERSION})
    return engine, f"fleetlog-ingest:{TAG}"


class Node:
    """The fields tests/test_lake_forward.py's helpers read."""

    def __init__(self, name: str, port: int) -> None:
        self.name, self.url = name, f"http://127.0.0.1:{port}"


def test_the_lake_image_serves_nodes_that_forward_to_each_other(lake_image, postgres, tmp_path):  # noqa: F811
    engine, image = lake_image
    label = run(engine, "image", "inspect", "--format", '{{index .Labels "io.fleetlog.extra"}}', image).stdout.strip()
    assert label == "lake"
    dsn = postgres.createdb("c" + uuid.uuid4().hex[:12])
    data = tmp_path / "lake"
    data.mkdir()
    data.chmod(0o777)  # the image's user writes the Parquet files
    containers = Containers(engine)
    nodes = []
    try:
        for name in ("c0", "c1"):
            port = free_port()
            env = {"FLEETLOG_PORT": str(port), "FLEETLOG_OTLP_GRPC_PORT": str(free_port()), "FLEETLOG_POLICY_INTERVAL_S": "0",
                   "FLEETLOG_ENROLL_TOKEN": TOKENS["enroll"], "FLEETLOG_READ_TOKEN": TOKENS["read"],
                   "FLEETLOG_ADMIN_TOKEN": TOKENS["admin"], "FLEETLOG_LAKE": dsn,
                   "FLEETLOG_LAKE_DATA": "/var/lib/fleetlog/lake", "FLEETLOG_NODE_ID": name,
                   "FLEETLOG_ADVERTISE_URL": f"http://127.0.0.1:{port}", "FLEETLOG_LAKE_LEASE_S": "3"}
            containers.start(name, image, env=env, volumes=(f"{data}:/var/lib/fleetlog/lake",))
            nodes.append(Node(name, port))

        def ready(node: Node) -> bool:
            if not containers.state(f"{containers.prefix}-{node.name}")["Running"]:
                raise AssertionError(f"{node.name} exited:\n{containers.logs(f'{containers.prefix}-{node.name}')[-3000:]}")
            try:
                with urllib.request.urlopen(node.url + "/readyz", timeout=5) as r:
                    return r.status == 200
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                return False

        for node in nodes:
            wait_for(lambda: ready(node), f"{node.name} ready", timeout_s=180)
        pg_dsn = dsn.removeprefix("postgres:")
        wait_for(lambda: len(owners(pg_dsn)) == 2 and sum(owners(pg_dsn).values()) == 64, "slots spread over both")
        owner_of = slot_owners(dsn)
        by_name = {n.name: n for n in nodes}
        ids = [f"C.img.{k}" for k in range(6)]
        assert {owner_of[slot_of(i)] for i in ids} == {"c0", "c1"}
        for i in ids:
            other = next(n for n in nodes if n.name != owner_of[slot_of(i)])
            status, reply = log_push(other, i, "managerlog", [f"{i} line {j}" for j in range(3)], TOKENS["admin"])
            assert status == 200 and orjson.loads(reply)["accepted"] == 3, reply[:300]
        for i in ids:
            reader = by_name[owner_of[slot_of(i)]]
            request = urllib.request.Request(reader.url + f"/api/v1/instances/{i}/logs?source=managerlog",
                                             headers={"Authorization": f"Bearer {TOKENS['read']}"})
            with urllib.request.urlopen(request, timeout=30) as r:
                lines = orjson.loads(r.read())["lines"]
            assert [(x["seq"], x["line"]) for x in lines] == [(j, f"{i} line {j}") for j in range(3)]
    finally:
        containers.remove_all()
