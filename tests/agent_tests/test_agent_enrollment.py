"""A registration stored by a busy server whose reply came after the agent's request timeout: the
agent's retry must get the same answer (its token), not a 409 that keeps its lines off the server."""

from __future__ import annotations

import http.server
import signal
import threading
import time
import urllib.error
import urllib.request

from agentlib import Api, assert_exactly_once, wait_until

TOKENS = ("--enroll-token", "fleet-enroll", "--read-token", "fleet-read", "--admin-token", "fleet-admin")
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


class SlowFirstRegistration(http.server.ThreadingHTTPServer):
    """A proxy to the real server that forwards everything, but answers the first registration only
    ``delay_s`` after the server stored it (a busy server, as the agent sees it)."""

    daemon_threads = True

    def __init__(self, upstream: str, delay_s: float) -> None:
        self.upstream, self.delay_s, self.registrations = upstream, delay_s, 0
        super().__init__(("127.0.0.1", 0), _Forward)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


class _Forward(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
        request = urllib.request.Request(self.server.upstream + self.path, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                status, reply, reply_headers = r.status, r.read(), r.headers
        except urllib.error.HTTPError as e:
            status, reply, reply_headers = e.code, e.read(), e.headers
        if "fleet-enroll" in self.headers.get("Authorization", ""):
            self.server.registrations += 1
            if self.server.registrations == 1:
                time.sleep(self.server.delay_s)  # stored; the agent has given up waiting
        try:
            self.send_response(status)
            for k, v in reply_headers.items():
                if k.lower() not in HOP_HEADERS:
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)
        except (BrokenPipeError, ConnectionResetError):
            pass


def test_agent_retry_after_a_timed_out_but_stored_registration_gets_in(tmp_path, server_process, agent):
    server = server_process(*TOKENS).start()
    api = Api(server.url, token="fleet-read")
    proxy = SlowFirstRegistration(server.url, delay_s=3.0)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        log = tmp_path / "cuzk.log"
        log.write_text("".join(f"cuzk-daemon: heartbeat {i}\n" for i in range(30)))
        token_file = tmp_path / "token"
        tail = agent("tail", proxy.url, "C.51", "--enroll-token", "fleet-enroll", "--token-file", str(token_file),
                     "--request-timeout-s", "1", "--gpu-interval-s", "0", "--tail", f"cuzk={log}")
        proc = tail.start()
        try:
            wait_until(lambda: api.count("C.51", "cuzk") == 30, timeout_s=60, what="the lines after a resent enrollment")
        except AssertionError as e:
            raise AssertionError(f"{e}; the agent said: {tail.err.read_text(errors='replace')[-600:]}") from None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert proxy.registrations >= 2  # the first timed out and was sent again
        assert "409" not in tail.err.read_text(errors="replace")
        assert_exactly_once(api, "C.51", "cuzk", log.read_text().splitlines())
        assert len(api.events("C.51", "registered")) == 1
    finally:
        proxy.shutdown()
        proxy.server_close()
