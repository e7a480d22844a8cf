"""Three ``fleetlog serve --lake`` processes behind no router at all: the plain-text /api/log-push and
OTLP (HTTP and gRPC, through the real OpenTelemetry exporters) sent to a node that does not own the
instance reach its owner, are acknowledged only after the owner committed, and are stored exactly
once; a forward that cannot reach the owner is a 503 + Retry-After (gRPC: UNAVAILABLE). Tokens
issued or revoked on one node hold on every node."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import time
import urllib.error
import urllib.request
import uuid

import grpc
import psycopg
import pytest
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest, ExportLogsServiceResponse
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import LogRecordExportResult, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource

from ingest.db.lake import storage as lake
from ingest.db.lake.slots import SLOTS, slot_of
from tests.lake_pg import postgres  # noqa: F401 (a fixture)
from tests.test_lake_nodes import Node, owners, wait_for
from tests.test_otlp import DAEMON, send_metrics

pytestmark = [pytest.mark.lake, pytest.mark.slow]

ENROLL, READ, ADMIN = "enroll-f1", "read-f1", "admin-f1"
TOKENS = ("--enroll-token", ENROLL, "--read-token", READ, "--admin-token", ADMIN)
MAX_BODY_BYTES = 2**20  # the shared cluster's, so that a body near it stays cheap to send
REVOKE_BOUND_S = 2.0
HUNG_PUSHES = 120  # more than aiohttp's default connection pool (100)  # docs/scale-out.md: a revoked token is refused everywhere within this (given an idle machine)


def start_cluster(postgres, tmp_path, nodes: list[Node], *extra: str, n: int = 3) -> Lake:  # noqa: F811
    dsn = postgres.createdb("f" + uuid.uuid4().hex[:12])
    nodes += [Node(f"n{i}", dsn, tmp_path / "lake", tmp_path, *TOKENS, *extra) for i in range(n)]
    for node in nodes:
        node.start()
    for node in nodes:
        wait_for(node.ready, f"{node.name} ready")
    pg_dsn = dsn.removeprefix("postgres:")
    wait_for(lambda: len(owners(pg_dsn)) == n and sum(owners(pg_dsn).values()) == SLOTS, f"slots spread over {n} nodes")
    return Lake(dsn, tmp_path / "lake", nodes)


class Lake:
    def __init__(self, dsn: str, data, nodes: list[Node]) -> None:
        self.dsn, self.data, self.nodes = dsn, data, nodes

    def stored(self, tmp_path, sql: str):
        """``sql`` on the lake, from a connection of the test's own, after checking the audit is empty."""
        check = lake.open_lake(self.dsn, str(self.data), temp_dir=str(tmp_path / f"check-{uuid.uuid4().hex[:6]}.tmp"))
        try:
            assert lake.audit(check) == []
            return check.execute(sql).fetchall()
        finally:
            check.close()


@pytest.fixture(scope="module")
def cluster(postgres, tmp_path_factory):  # noqa: F811
    nodes: list[Node] = []
    try:  # leases of 10 s: a renewal delayed by a loaded machine does not move slots mid-test
        yield start_cluster(postgres, tmp_path_factory.mktemp("fwd"), nodes, "--lake-lease-s", "10",
                            "--max-body-bytes", str(MAX_BODY_BYTES))
    finally:
        for node in nodes:
            node.kill(signal.SIGTERM)


@pytest.fixture
def doomed_cluster(postgres, tmp_path):  # noqa: F811
    """A cluster of its own, for a test that kills one of its nodes. Leases of 20 s: the dead node's
    slots stay its own long enough for the entry node to try (and fail) to reach it."""
    nodes: list[Node] = []
    try:
        yield start_cluster(postgres, tmp_path, nodes, "--lake-lease-s", "20", "--forward-timeout-s", "5")
    finally:
        for node in nodes:
            node.kill(signal.SIGTERM)


def slot_owners(dsn: str) -> dict[int, str]:
    with psycopg.connect(dsn.removeprefix("postgres:")) as conn:
        return dict(conn.execute("SELECT slot, owner FROM fleetlog_slots WHERE expires_at > now()").fetchall())


def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def post_until_acked(url: str, body: bytes, headers: dict[str, str], timeout_s: float = 120) -> tuple[int, bytes]:
    """As an agent: a 503 must say when to retry (Retry-After), and is retried; anything else is final."""
    deadline = time.monotonic() + timeout_s
    while True:
        status, got, reply = post(url, body, headers)
        if status != 503:
            return status, reply
        assert "Retry-After" in got, (status, got, reply[:300])
        assert time.monotonic() < deadline, f"still 503 after {timeout_s} s: {reply[:300]!r}"
        time.sleep(0.2)


def log_push(node: Node, instance_id: str, source: str, lines: list[str], token: str = ADMIN) -> tuple[int, bytes]:
    headers = {"X-Instance-Id": instance_id, "X-Log-Source": source, "Content-Type": "text/plain",
               "Authorization": f"Bearer {token}"}
    return post_until_acked(node.url + "/api/log-push", "\n".join(lines).encode() + b"\n", headers)


class Recording:
    """A log exporter that keeps every export's result (the SDK's processor drops it)."""

    def __init__(self, exporter) -> None:
        self.exporter, self.results = exporter, []

    def export(self, batch):
        result = self.exporter.export(batch)
        self.results.append(result)
        return result

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def send_logs(exporter, instance_id: str, source: str, lines: list[str], *, numbered: bool) -> list:
    recording = Recording(exporter)
    provider = LoggerProvider(resource=Resource.create({"service.instance.id": instance_id, "service.name": "curio"}))
    provider.add_log_record_processor(SimpleLogRecordProcessor(recording))
    logger = provider.get_logger("fleetlog.test")
    for seq, line in enumerate(lines):
        attributes = {"log.source": source, **({"log.seq": seq} if numbered else {})}
        logger.emit(body=line, attributes=attributes, timestamp=1795951248_000_000_000 + seq * 1000)
    provider.shutdown()
    return recording.results


def collector_body(instances: list[str], source: str) -> ExportLogsServiceRequest:
    """What an OpenTelemetry Collector batches: several resources (instances) in one request, and a
    resource with no instance at all (its 2 records rejected alone, in partial_success)."""
    request = ExportLogsServiceRequest()
    for instance_id in [*instances, None]:
        resource_logs = request.resource_logs.add()
        if instance_id is not None:
            attr = resource_logs.resource.attributes.add()
            attr.key, attr.value.string_value = "service.instance.id", instance_id
        scope = resource_logs.scope_logs.add()
        for seq in range(2):
            record = scope.log_records.add()
            record.time_unix_nano = 1795951248_000_000_000 + seq
            record.body.string_value = f"{instance_id} collector {seq}"
            for key, value in (("log.source", source), ("log.seq", seq)):
                attr = record.attributes.add()
                attr.key = key
                if isinstance(value, int):
                    attr.value.int_value = value
                else:
                    attr.value.string_value = value
    return request


def accepted_lines(node: Node) -> float:
    """The node's own committed log rows (JSON, plain text and OTLP), from its /metrics."""
    request = urllib.request.Request(node.url + "/metrics", headers={"Authorization": f"Bearer {READ}"})
    with urllib.request.urlopen(request, timeout=30) as r:
        text = r.read().decode()
    return sum(float(v) for v in re.findall(r'^fleetlog_ingest_accepted_rows_total\{kind="(?:logs|otlp_logs)"\} (\S+)$',
                                              text, re.MULTILINE))


def test_log_push_and_otlp_sent_to_any_node_are_stored_once_by_the_owner(cluster, tmp_path):
    dsn, nodes = cluster.dsn, cluster.nodes
    by_name = {n.name: n for n in nodes}
    owner_of = slot_owners(dsn)
    ids = [f"C.fwd.{k}" for k in range(9)]
    owner = {i: by_name[owner_of[slot_of(i)]] for i in ids}
    assert len({o.name for o in owner.values()}) == 3  # the instances span all three owners
    others = {i: itertools.cycle([n for n in nodes if n is not owner[i]]) for i in ids}  # never the owner
    before = {n.name: accepted_lines(n) for n in nodes}
    expected: dict[tuple[str, str], list[str]] = {}

    # the old manager's plain text, numbered by the server: 4 pushes of 10 lines per instance, each to a non-owner
    for round_ in range(4):
        for i in ids:
            lines = [f"{i} manager line {round_ * 10 + j}" for j in range(10)]
            status, reply = log_push(next(others[i]), i, "managerlog", lines)
            assert status == 200 and json.loads(reply)["accepted"] == 10, (status, reply[:300])
            expected.setdefault((i, "managerlog"), []).extend(lines)

    # the OpenTelemetry SDK's exporters, pointed at a non-owner: HTTP numbered, gRPC numbered by the server
    auth = {"Authorization": f"Bearer {ADMIN}"}
    for i in ids[:5]:
        node = next(others[i])
        results = send_logs(HttpLogExporter(endpoint=node.url + "/v1/logs", headers=auth), i, "otlphttp", DAEMON, numbered=True)
        assert results == [LogRecordExportResult.SUCCESS] * len(DAEMON), (i, node.name, results)
        expected[(i, "otlphttp")] = list(DAEMON)
    for i in ids[4:]:
        node = next(others[i])
        results = send_logs(GrpcLogExporter(endpoint=node.grpc, insecure=True, headers={"authorization": f"Bearer {ADMIN}"}),
                            i, "otlpgrpc", DAEMON, numbered=False)
        assert results == [LogRecordExportResult.SUCCESS] * len(DAEMON), (i, node.name, results)
        expected[(i, "otlpgrpc")] = list(DAEMON)

    # a Collector's batch spanning every owner, as protobuf to one node, then again as JSON to another
    request = collector_body(ids, "collector")
    for node, content_type, body in ((nodes[0], "application/x-protobuf", request.SerializeToString()),
                                     (nodes[1], "application/json", None)):
        if body is None:
            from google.protobuf import json_format

            body = json_format.MessageToJson(request).encode()
        status, reply = post_until_acked(node.url + "/v1/logs", body, {"Content-Type": content_type, **auth})
        assert status == 200, reply[:300]
        if content_type == "application/json":
            assert json.loads(reply)["partialSuccess"]["rejectedLogRecords"] == "2"
        else:
            assert ExportLogsServiceResponse.FromString(reply).partial_success.rejected_log_records == 2
    for i in ids:
        expected[(i, "collector")] = [f"{i} collector {s}" for s in range(2)]

    # metrics too (no seq: stored as sent), through both exporters and a non-owner
    send_metrics(HttpMetricExporter(endpoint=next(others[ids[0]]).url + "/v1/metrics", headers=auth), ids[0])
    send_metrics(GrpcMetricExporter(endpoint=next(others[ids[1]]).grpc, insecure=True,
                                    headers={"authorization": f"Bearer {ADMIN}"}), ids[1])

    assert slot_owners(dsn) == owner_of, "the slots moved during the test: the per-node counts below would not hold"
    rows = cluster.stored(tmp_path, "SELECT instance_id, source, seq, line FROM logs WHERE instance_id LIKE 'C.fwd.%' "
                                 "ORDER BY instance_id, source, seq")
    got: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for instance_id, source, seq, line in rows:
        got.setdefault((instance_id, source), []).append((seq, line))
    # every acknowledged line once, numbered 0..n-1 in the order sent: one numbering, the owner's
    assert got == {key: list(enumerate(lines)) for key, lines in expected.items()}
    # and each node committed exactly the lines of the instances it owns (a non-owner wrote none)
    written = {n.name: accepted_lines(n) - before[n.name] for n in nodes}
    owned = {n.name: sum(len(lines) for (i, _s), lines in expected.items() if owner[i] is n) for n in nodes}
    assert written == owned
    metrics = cluster.stored(tmp_path, "SELECT instance_id, count(*) FROM metrics WHERE instance_id LIKE 'C.fwd.%' GROUP BY 1 ORDER BY 1")
    assert metrics == [(ids[0], 3), (ids[1], 3)]


def _enroll(node: Node, instance_id: str) -> str:
    event = {"instance_id": instance_id, "kind": "registered", "ts": time.time(), "machine_id": 41}
    status, reply = post_until_acked(node.url + "/api/v1/events", json.dumps(event).encode(),
                                     {"Content-Type": "application/json", "Authorization": f"Bearer {ENROLL}"})
    assert status == 200, reply[:300]
    return json.loads(reply)["tokens"][instance_id]


def test_a_token_issued_or_revoked_on_one_node_holds_on_every_node(cluster, tmp_path):
    dsn, nodes = cluster.dsn, cluster.nodes
    by_name = {n.name: n for n in nodes}
    instance_id = "C.tok.1"
    owner = by_name[slot_owners(dsn)[slot_of(instance_id)]]
    a, b = [n for n in nodes if n is not owner]
    first = _enroll(a, instance_id)  # through a non-owner: forwarded, issued by the owner
    for node in (b, owner, a):  # known at once everywhere (b and a look it up in PostgreSQL)
        status, reply = log_push(node, instance_id, "managerlog", [f"with the first token via {node.name}"], first)
        assert status == 200, (node.name, reply[:300])

    # an admin re-issues it through a node that is not the owner (which forwards it): the first token is revoked
    status, _h, reply = post(a.url + f"/api/v1/instances/{instance_id}/token", b"", {"Authorization": f"Bearer {ADMIN}"})
    assert status == 200, reply[:300]
    second = json.loads(reply)["token"]
    revoked_at = time.monotonic()
    for node in (b, owner, a):
        status, reply = log_push(node, instance_id, "managerlog", [f"with the second token via {node.name}"], second)
        assert status == 200, (node.name, reply[:300])
    refused_after = {}
    for node in (b, owner, a):
        def refused() -> bool:
            status, reply = log_push(node, instance_id, "managerlog", ["with the revoked token"], first)
            assert status in (200, 401), (status, reply[:300])
            return status == 401

        wait_for(refused, f"the revoked token refused by {node.name}", timeout_s=30)
        refused_after[node.name] = time.monotonic() - revoked_at
    # the documented bound, with room for a loaded machine (two shared cores)
    assert max(refused_after.values()) < 5 * REVOKE_BOUND_S, refused_after
    rows = cluster.stored(tmp_path, f"SELECT count(*) FROM logs WHERE instance_id = '{instance_id}' AND line LIKE 'with the second%'")
    assert rows == [(3,)]


def test_a_forward_the_owner_cannot_take_is_503_with_retry_after_then_lands_once(doomed_cluster, tmp_path):
    dsn, nodes = doomed_cluster.dsn, doomed_cluster.nodes
    owner_of = slot_owners(dsn)
    victim = nodes[2]
    instance_id = next(f"C.dead.{k}" for k in itertools.count() if owner_of[slot_of(f"C.dead.{k}")] == victim.name)
    entry = nodes[0]
    headers = {"X-Instance-Id": instance_id, "X-Log-Source": "managerlog", "Content-Type": "text/plain",
               "Authorization": f"Bearer {ADMIN}"}
    # hung first (SIGSTOP: connections are accepted, nothing answers): the client is not held past the
    # forward timeout (5 s here), and is told to retry
    os.killpg(victim.proc.pid, signal.SIGSTOP)
    asked = time.monotonic()
    status, got, reply = post(entry.url + "/api/log-push", b"line while the owner hangs\n", headers)
    assert status == 503 and int(got["Retry-After"]) >= 1, (status, reply[:300])
    assert time.monotonic() - asked < 20, time.monotonic() - asked
    assert requests_bytes(entry) == 0  # the entry node's share of the budget is handed back with the 503
    victim.kill()  # SIGKILL: its leases stay live until they expire, so the entry node still routes to it
    status, got, reply = post(entry.url + "/api/log-push", b"line while the owner is dead\n", headers)
    assert status == 503 and int(got["Retry-After"]) >= 1, (status, reply[:300])
    otlp = collector_body([instance_id], "collector")
    otlp.resource_logs.pop()  # only the instance's resource
    status, got, reply = post(entry.url + "/v1/logs", otlp.SerializeToString(),
                              {"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {ADMIN}"})
    assert status == 503 and int(got["Retry-After"]) >= 1, (status, reply[:300])
    with grpc.insecure_channel(entry.grpc) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            logs_service_pb2_grpc.LogsServiceStub(channel).Export(
                otlp, metadata=[("authorization", f"Bearer {ADMIN}")], timeout=60)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
    # an agent retrying meanwhile gets 503s, then (after the takeover) its one acknowledgement
    status, reply = post_until_acked(entry.url + "/api/log-push", b"line while the owner is dead\n", headers)
    assert status == 200 and json.loads(reply)["accepted"] == 1, reply[:300]
    status, reply = post_until_acked(entry.url + "/v1/logs", otlp.SerializeToString(),
                                     {"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {ADMIN}"})
    assert status == 200, reply[:300]
    assert victim.name not in slot_owners(dsn).values()  # the survivors serve every slot now
    rows = doomed_cluster.stored(tmp_path, f"SELECT source, seq, line FROM logs WHERE instance_id = '{instance_id}' ORDER BY source, seq")
    assert rows == [("collector", 0, f"{instance_id} collector 0"), ("collector", 1, f"{instance_id} collector 1"),
                    ("managerlog", 0, "line while the owner is dead")]


def test_an_instance_token_pushes_only_its_own_instance_whichever_node_it_reaches(cluster, tmp_path):
    """The holder of C.1's token tries to write C.2's rows through the forwarding: split bodies,
    OTLP resources naming C.2, log-push's X-Instance-Id, a forged forwarding header, the read token.
    Every try is refused as one node refuses it (403, nothing of the request stored, C.1's part
    neither), whichever node it reaches."""
    dsn, nodes = cluster.dsn, cluster.nodes
    by_name = {n.name: n for n in nodes}
    owner_of = slot_owners(dsn)
    mine = "C.atk.1"
    theirs = next(f"C.atk.{k}" for k in itertools.count(2) if owner_of[slot_of(f"C.atk.{k}")] != owner_of[slot_of(mine)])
    my_owner, their_owner = by_name[owner_of[slot_of(mine)]], by_name[owner_of[slot_of(theirs)]]
    third = next(n for n in nodes if n not in (my_owner, their_owner))
    token = _enroll(third, mine)
    auth = {"Authorization": f"Bearer {token}"}

    def stream(instance_id: str) -> dict:
        return {"instance_id": instance_id, "source": "attack", "lines": [{"seq": 0, "ts": time.time(), "line": "x"}]}

    split = json.dumps({"streams": [stream(mine), stream(theirs)]}).encode()
    otlp_split = collector_body([mine, theirs], "attack")
    for node in (my_owner, third, their_owner):
        status, _h, reply = post(node.url + "/api/v1/logs", split, {"Content-Type": "application/json", **auth})
        assert status == 403, (node.name, status, reply[:300])
        status, _h, reply = post(node.url + "/v1/logs", otlp_split.SerializeToString(),
                                 {"Content-Type": "application/x-protobuf", **auth})
        assert status == 403, (node.name, status, reply[:300])
        with grpc.insecure_channel(node.grpc) as channel:
            with pytest.raises(grpc.RpcError) as refused:
                logs_service_pb2_grpc.LogsServiceStub(channel).Export(
                    otlp_split, metadata=[("authorization", f"Bearer {token}")], timeout=60)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, (node.name, refused.value)
        status, _h, reply = post(node.url + "/api/log-push", b"x\n", {"X-Instance-Id": theirs, "X-Log-Source": "attack",
                                                                      "Content-Type": "text/plain", **auth})
        assert status == 403, (node.name, status, reply[:300])
        # a header only nodes should send, sent by the client: no check is skipped
        status, _h, reply = post(node.url + "/api/v1/logs", json.dumps(stream(theirs)).encode(),
                                 {"Content-Type": "application/json", "X-Fleetlog-Forwarded": their_owner.name, **auth})
        assert status in (403, 503), (node.name, status, reply[:300])
        status, _h, reply = post(node.url + "/api/v1/logs", json.dumps(stream(theirs)).encode(),
                                 {"Content-Type": "application/json", "Authorization": f"Bearer {READ}"})
        assert status == 403, (node.name, status, reply[:300])
    rows = cluster.stored(tmp_path, f"SELECT instance_id, count(*) FROM logs WHERE instance_id IN ('{mine}', '{theirs}') GROUP BY 1")
    assert rows == []
    for node in nodes:  # every refused request, forwarded or not, gave its share of the memory budget back
        assert requests_bytes(node) == 0, node.name


def requests_bytes(node: Node) -> float:
    request = urllib.request.Request(node.url + "/metrics", headers={"Authorization": f"Bearer {READ}"})
    with urllib.request.urlopen(request, timeout=30) as r:
        return float(re.search(r"^fleetlog_memory_requests_bytes (\S+)$", r.read().decode(), re.MULTILINE).group(1))


def test_a_request_split_across_owners_is_capped_as_a_whole(cluster, tmp_path):
    """One node refuses 1,001 streams, or 1,001 events, in one request (413); split across three
    owners, each part is under the cap, and the whole must still be refused, with nothing stored."""
    ids = [f"C.cap.{k}" for k in range(1001)]
    assert len({slot_owners(cluster.dsn)[slot_of(i)] for i in ids}) == 3
    auth = {"Content-Type": "application/json", "Authorization": f"Bearer {ADMIN}"}
    streams = {"streams": [{"instance_id": i, "source": "cap", "lines": [{"seq": 0, "ts": time.time(), "line": "x"}]}
                           for i in ids]}
    events = [{"instance_id": i, "kind": "running", "ts": time.time()} for i in ids]
    for path, body in (("/api/v1/logs", streams), ("/api/v1/events", events)):
        status, _h, reply = post(cluster.nodes[0].url + path, json.dumps(body).encode(), auth)
        assert status == 413, (path, status, reply[:300])
    rows = cluster.stored(tmp_path, "SELECT count(*) FROM logs WHERE instance_id LIKE 'C.cap.%'")
    assert rows == [(0,)]


def test_a_body_under_the_limit_is_not_refused_for_what_forwarding_makes_of_it(cluster):
    """A number written as ``1e15`` is 4 bytes; parsed and written again it is 18. A JSON body under
    max_body_bytes that the entry node re-encoded for its owner came out over it (413 from the
    owner, where the owner itself would have taken the same body)."""
    nodes = cluster.nodes
    by_name = {n.name: n for n in nodes}
    instance_id = "C.big.1"
    owner = by_name[slot_owners(cluster.dsn)[slot_of(instance_id)]]
    entry = next(n for n in nodes if n is not owner)
    labels = ",".join(f'"k{k}":1e15' for k in range(60_000))
    body = ('{"instance_id":"%s","samples":[{"name":"wide","ts":%f,"value":1,"labels":{%s}}]}'
            % (instance_id, time.time(), labels)).encode()
    assert MAX_BODY_BYTES // 2 < len(body) < MAX_BODY_BYTES < len(json.dumps(json.loads(body)).encode())
    auth = {"Content-Type": "application/json", "Authorization": f"Bearer {ADMIN}"}
    for node in (owner, entry):
        status, reply = post_until_acked(node.url + "/api/v1/metrics", body, auth)
        assert status == 200, (node.name, status, reply[:300])


def test_a_registration_split_across_owners_refused_for_one_instance_registers_none(cluster):
    """The enrollment token registers new instances only. An events array registering a new
    instance and one that exists, owned by two nodes, is refused 409 as one node refuses it, with
    nothing written: the new instance must stay free to register (its token would otherwise be
    issued, and lost with the 409)."""
    nodes = cluster.nodes
    by_name = {n.name: n for n in nodes}
    owner_of = slot_owners(cluster.dsn)
    old = "C.reg.0"
    _enroll(nodes[0], old)
    new = next(f"C.reg.{k}" for k in itertools.count(1) if owner_of[slot_of(f"C.reg.{k}")] != owner_of[slot_of(old)])
    entry = by_name[owner_of[slot_of(new)]]  # it writes its own part first
    events = [{"instance_id": i, "kind": "registered", "ts": time.time(), "machine_id": 41} for i in (new, old)]
    status, _h, reply = post(entry.url + "/api/v1/events", json.dumps(events).encode(),
                             {"Content-Type": "application/json", "Authorization": f"Bearer {ENROLL}"})
    assert status == 409 and old in json.loads(reply)["error"], (status, reply[:300])
    assert _enroll(entry, new)  # still new: registered now, and its token handed out
