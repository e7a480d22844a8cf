"""With tokens on, lines spooled while the server was down are resent with the instance's token."""

from __future__ import annotations

import signal

from agentlib import Api, assert_exactly_once, wait_until

TOKENS = ("--enroll-token", "fleet-enroll", "--read-token", "fleet-read", "--admin-token", "fleet-admin")


def test_spooled_lines_are_resent_with_the_instance_token_after_an_outage(tmp_path, server_process, agent):
    server = server_process(*TOKENS).start()
    api = Api(server.url, token="fleet-read")
    log = tmp_path / "cuzk.log"
    log.write_text("".join(f"cuzk-daemon: heartbeat {i}\n" for i in range(50)))
    tail = agent("tail", server.url, "C.21", "--enroll-token", "fleet-enroll", "--token-file", str(tmp_path / "token"),
                 "--tail", f"cuzk={log}")
    proc = tail.start()
    wait_until(lambda: api.count("C.21", "cuzk") == 50, what="the first 50 lines")
    token = (tmp_path / "token").read_text().strip()
    server.kill()  # the server dies; the agent keeps reading into its spool
    with log.open("a") as f:
        f.write("".join(f"cuzk-daemon: heartbeat {i}\n" for i in range(50, 300)))
    wait_until(lambda: (tail.spool / "spool").exists() and any((tail.spool / "spool").iterdir()), what="records in the spool")
    server.start()  # same database, same tokens: the instance token is still known
    wait_until(lambda: api.count("C.21", "cuzk") == 300, timeout_s=30, what="the spooled lines resent")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert_exactly_once(api, "C.21", "cuzk", log.read_text().splitlines())
    assert (tmp_path / "token").read_text().strip() == token  # no second enrollment was needed
    registered = api.events("C.21", "registered")
    assert len(registered) == 1


def test_an_agent_refused_enrollment_for_a_known_instance_keeps_its_lines_until_a_reissued_token(tmp_path, server_process, agent):
    """The instance is already enrolled (its token was lost with the reply or the file): the server
    answers 409 to the enrollment token. The lines are evidence: the agent keeps them and says what
    an operator must do; once an admin re-issues the token into the token file, they all arrive."""
    import orjson
    import urllib.request

    server = server_process(*TOKENS).start()
    api = Api(server.url, token="fleet-read")

    def post(path: str, body: dict, token: str) -> dict:
        request = urllib.request.Request(server.url + path, data=orjson.dumps(body), method="POST",
                                         headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as r:
            return orjson.loads(r.read())

    post("/api/v1/events", {"instance_id": "C.22", "kind": "registered", "ts": 1795000000.0}, "fleet-enroll")
    log = tmp_path / "cuzk.log"
    log.write_text("".join(f"cuzk-daemon: heartbeat {i}\n" for i in range(40)))
    token_file = tmp_path / "token"
    tail = agent("tail", server.url, "C.22", "--enroll-token", "fleet-enroll", "--token-file", str(token_file),
                 "--tail", f"cuzk={log}")
    proc = tail.start()

    def said() -> str:
        return tail.err.read_text(errors="replace")

    wait_until(lambda: "409" in said() and "re-issue" in said(), timeout_s=30,
               what="the agent saying the instance needs a re-issued token")
    assert api.count("C.22", "cuzk") == 0
    assert "dropping" not in said()
    reissued = post("/api/v1/instances/C.22/token", {}, "fleet-admin")["token"]
    token_file.write_text(orjson.dumps({"instance_id": "C.22", "token": reissued}).decode())
    wait_until(lambda: api.count("C.22", "cuzk") == 40, timeout_s=60, what="the held lines sent with the re-issued token")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert_exactly_once(api, "C.22", "cuzk", log.read_text().splitlines())
