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
