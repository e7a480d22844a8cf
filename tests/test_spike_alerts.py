"""Spike alerts: N failures of one class on one GPU model within a window (migration 018's
failure_spikes view, rule 70_failure_spike) are one episode, notified once through
--notify-webhook-url with a link to the page view listing those failures.

The episode test drives the rule on the real app with chosen clocks; the end-to-end test runs real
agents (``fleetlog-agent run`` of tests/scripts/bench_oom.sh) against a real server, a real HTTP
receiver on loopback takes the notifications, and the link is opened in headless Chromium.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import aiohttp
import orjson
import pytest
from aiohttp import web
from playwright.async_api import expect

from ingest.app import create_app
from tests.conftest import REPO, kill_group
from tests.fleet import bench_instance, rows, run_policies, utcnow
from tests.test_page import ARTIFACTS, POLL_TIMEOUT_MS, page  # noqa: F401 (the Chromium fixture)

OOM_EXCERPT = "ERROR cuzk_daemon::pce: CUDA error: out of memory (cudaErrorMemoryAllocation) allocating 3.2 GiB for NTT"
SCRIPTS = REPO / "tests" / "scripts"
DEADLINE_S = 180  # per wait: generous, so that a loaded machine still passes


def alerts(client) -> list[tuple]:
    return rows(client, "SELECT subject, episode, state, evidence FROM decisions WHERE action = 'alert' ORDER BY episode")


async def test_a_spike_is_one_episode_notified_once_and_a_later_burst_is_another(aiohttp_client, settings):
    client = await aiohttp_client(create_app(replace(settings, spike_failures=5, spike_window_s=600.0,
                                                     public_url="https://fleet.example.com")))
    t0 = (utcnow() - dt.timedelta(hours=3)).replace(microsecond=0)

    def at(minutes: float) -> dt.datetime:
        return t0 + dt.timedelta(minutes=minutes)

    async def failures(prefix: str, minutes: list[float], gpu_model: str = "RTX PRO 4000") -> None:
        for n, m in enumerate(minutes):
            await bench_instance(client, f"{prefix}{n}", 9000 + len(prefix) * 100 + n, done=at(m), exit_code=1, rate=0.0,
                                 gpu_model=gpu_model, dph=0.5, excerpt=OOM_EXCERPT)

    await failures("C.a", [0, 1, 2, 3, 4])  # a burst: 5 within 4 minutes
    await failures("C.slow", [60, 63, 66, 69])  # only 4 within any 10 minutes
    await failures("C.other", [30, 33, 36, 39, 42], gpu_model="RTX 4090")  # 5, but spanning 12 minutes
    await failures("C.b", [120, 120.5, 121, 121.5, 122, 125])  # a second burst, 2 hours later

    for minute in (2, 4.05, 5, 8, 13, 70, 121):  # the rule on the clock of each moment
        await run_policies(client, now=at(minute))
    assert [(s, e) for s, e, *_ in alerts(client)] == [("oom on RTX PRO 4000", at(4).strftime("%Y-%m-%dT%H:%M:%S.%fZ"))]
    [(_, _, state, evidence)] = alerts(client)
    evidence = orjson.loads(evidence)
    assert state == "executed"  # nothing to carry out: the notification is the alert
    assert evidence["failures"] == 5 and evidence["machines"] == 5 and evidence["threshold"] == 5
    assert evidence["instances"] == [f"C.a{n}" for n in range(5)]
    assert evidence["cost_usd"] == pytest.approx(5 * 0.5 * 14 / 60, abs=1e-4)  # each: registered 14 min before it failed
    query = parse_qs(urlsplit(evidence["link"]).fragment.split("?", 1)[1])
    assert evidence["link"].startswith("https://fleet.example.com/#/failures?")
    assert query == {"class": ["oom"], "gpu": ["RTX PRO 4000"], "since": [at(0).strftime("%Y-%m-%dT%H:%M:%S")],
                     "until": [at(4).strftime("%Y-%m-%dT%H:%M:%S")]}

    for minute in (122.5, 126, 131, 200):  # the second burst: its own episode, grown to 6 failures
        await run_policies(client, now=at(minute))
    got = alerts(client)
    assert [e for _, e, *_ in got] == [at(4).strftime("%Y-%m-%dT%H:%M:%S.%fZ"), at(122).strftime("%Y-%m-%dT%H:%M:%S.%fZ")]
    assert orjson.loads(got[1][3])["failures"] == 6  # the decision follows its episode; no second decision
    spikes = rows(client, "SELECT failure_class, gpu_model, failures, started_at, ended_at FROM failure_spikes ORDER BY started_at")
    # the second spike: up from its fifth failure (122) until its second leaves the window (120.5 + 10)
    assert spikes == [("oom", "RTX PRO 4000", 5, at(4), at(10)), ("oom", "RTX PRO 4000", 6, at(122), at(130.5))]


async def test_a_failure_that_arrives_late_from_before_the_spike_joins_the_held_episode(aiohttp_client, settings):
    """An episode begins at its N-th failure; one from before it that arrives (or is classed) late moves
    that start. The decision keeps its key: nobody is told twice about one spike."""
    client = await aiohttp_client(create_app(replace(settings, spike_failures=5, spike_window_s=600.0)))
    t0 = (utcnow() - dt.timedelta(minutes=20)).replace(microsecond=0)
    for n, m in [(0, 0), (1, 1), (2, 2), (3, 3), (5, 5)]:
        await bench_instance(client, f"C.{n}", 500 + n, done=t0 + dt.timedelta(minutes=m), exit_code=1, rate=0.0,
                             gpu_model="RTX PRO 4000", excerpt=OOM_EXCERPT)
    await run_policies(client, now=t0 + dt.timedelta(minutes=6))
    [(_, episode, _, _)] = alerts(client)
    await bench_instance(client, "C.4", 504, done=t0 + dt.timedelta(minutes=4), exit_code=1, rate=0.0,
                         gpu_model="RTX PRO 4000", excerpt=OOM_EXCERPT)
    await run_policies(client, now=t0 + dt.timedelta(minutes=6, seconds=30))
    assert rows(client, "SELECT started_at FROM failure_spikes") == [(t0 + dt.timedelta(minutes=4),)]  # the start moved
    [(_, held, _, evidence)] = alerts(client)
    assert held == episode and orjson.loads(evidence)["failures"] == 6


async def test_no_spike_below_the_threshold_or_when_turned_off(aiohttp_client, settings):
    client = await aiohttp_client(create_app(replace(settings, spike_failures=0)))
    for n in range(6):
        await bench_instance(client, f"C.{n}", 100 + n, done=utcnow() - dt.timedelta(seconds=60 - n), exit_code=1,
                             rate=0.0, gpu_model="RTX PRO 4000", excerpt=OOM_EXCERPT)
    await run_policies(client)
    assert alerts(client) == [] and rows(client, "SELECT count(*) FROM failure_spikes") == [(0,)]


# -- end to end: real agents, a real server, a real receiver, the link in Chromium -------------------

class Receiver:
    """A webhook receiver on loopback that keeps every JSON body POSTed to it."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> "Receiver":
        async def hook(request: web.Request) -> web.Response:
            self.bodies.append(await request.json())
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_post("/hook", hook)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        host, port = self.runner.addresses[0][:2]
        self.url = f"http://{host}:{port}/hook"
        return self

    def alerts(self) -> list[dict]:
        return [b for b in self.bodies if b["event"] == "alert"]

    async def stop(self) -> None:
        if self.runner:
            await self.runner.cleanup()


AGENT_FAST = ["--retry-initial-delay-s", "0.05", "--retry-max-delay-s", "0.3", "--poll-interval-s", "0.02",
              "--batch-max-delay-s", "0.05", "--flush-timeout", "30", "--gpu-interval-s", "0"]


async def run_agents(tmp_path: Path, url: str, runs: list[tuple[str, int, str, str]], started: list) -> None:
    """``fleetlog-agent run`` for each (instance_id, machine_id, gpu_model, script) side by side, each
    in its own process group; waits until every one has exited."""
    procs = []
    for instance_id, machine_id, gpu_model, script in runs:
        where = tmp_path / instance_id
        where.mkdir()
        log = where / "cuzk-bench-daemon.log"
        argv = [sys.executable, "-m", "agent.cli", "run", "--server", url, "--instance-id", instance_id,
                "--spool", str(where / "spool"), "--machine-id", str(machine_id), "--gpu-model", gpu_model,
                "--gpu-count", "1", "--dph", "0.35", *AGENT_FAST, "--tail", f"benchdaemon={log}",
                "--", str(SCRIPTS / script), str(log)]
        with open(where / "agent.out", "wb") as out:
            proc = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                    env=dict(os.environ, PYTHONUNBUFFERED="1"))
        started.append(proc)
        procs.append((instance_id, proc))
    for instance_id, proc in procs:
        code = await asyncio.to_thread(proc.wait, DEADLINE_S)
        expected = 0 if dict((r[0], r[3]) for r in runs)[instance_id] == "bench_ok.sh" else 1
        assert code == expected, (instance_id, code, (tmp_path / instance_id / "agent.out").read_text()[-2000:])


async def until(what: str, check, timeout_s: float = DEADLINE_S):
    deadline = time.monotonic() + timeout_s
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not after {timeout_s} s")
        await asyncio.sleep(0.2)


@pytest.mark.slow
async def test_five_ooms_from_real_agents_on_one_gpu_model_notify_once_with_a_link_to_them(
        tmp_path, server_process, page):  # noqa: F811
    receiver = await Receiver().start()
    server = server_process("--policy-interval-s", "1", "--spike-failures", "5", "--spike-window-s", "600",
                            "--notify-webhook-url", receiver.url)
    server.extra = (*server.extra, "--public-url", server.url)  # the link must open this server's page
    started: list[subprocess.Popen] = []
    try:
        await asyncio.to_thread(server.start)
        async with aiohttp.ClientSession(base_url=server.url) as http:
            async def sql(query: str) -> list[list]:
                async with http.post("/api/v1/query", data=orjson.dumps({"sql": query})) as r:
                    assert r.status == 200, await r.text()
                    return (await r.json())["rows"]

            async def cycles() -> float:
                async with http.get("/metrics") as r:
                    text = await r.text()
                return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                           if line.startswith("fleetlog_policy_runs_total{"))

            async def wait_cycles(n: int) -> None:
                start = await cycles()

                async def done():
                    return await cycles() >= start + n
                await until(f"{n} policy cycles", done)

            async def classed(n: int):
                found = await sql("SELECT count(*) FROM failures WHERE failure_class = 'oom' AND gpu_model = 'RTX PRO 4000'")
                return found[0][0] >= n

            pro = "RTX PRO 4000"
            # four OOMs on the RTX PRO 4000, one on a 4090, a healthy run on the PRO 4000: no spike yet
            await run_agents(tmp_path, server.url, [
                *[(f"C.spike{n}", 7100 + n, pro, "bench_oom.sh") for n in range(4)],
                ("C.other", 7200, "RTX 4090", "bench_oom.sh"), ("C.healthy", 7300, pro, "bench_ok.sh")], started)
            await until("four OOMs classed", lambda: classed(4))
            await wait_cycles(3)
            assert receiver.alerts() == [], receiver.alerts()

            # the fifth: a spike, notified once
            await run_agents(tmp_path, server.url, [("C.spike4", 7104, pro, "bench_oom.sh")], started)

            async def notified():
                return receiver.alerts()
            [body] = await until("the spike's notification", notified)
            await wait_cycles(3)
            assert len(receiver.alerts()) == 1, receiver.alerts()  # not one per cycle

            # a sixth within the window is the same episode: its decision grows, nobody is told again
            await run_agents(tmp_path, server.url, [("C.spike5", 7105, pro, "bench_oom.sh")], started)

            async def grown():
                got = await sql("SELECT evidence->>'failures' FROM decisions WHERE action = 'alert'")
                return got == [["6"]]
            await until("the episode's decision to count the sixth", grown)
            await wait_cycles(3)
            assert len(receiver.alerts()) == 1, receiver.alerts()
            (tmp_path / "notification.json").write_bytes(orjson.dumps(body, option=orjson.OPT_INDENT_2))

        decision = body["decision"]
        evidence = decision["evidence"]
        assert (decision["rule"], decision["action"], decision["subject"]) == ("failure_spike", "alert", f"oom on {pro}")
        assert sorted(evidence["instances"]) == [f"C.spike{n}" for n in range(5)]
        assert evidence["failures"] == 5 and evidence["machines"] == 5
        assert decision["reason"].startswith(f"5 oom failures on {pro} within 600 s")
        link = evidence["link"]
        assert link.startswith(server.url + "/#/failures?"), link
        query = parse_qs(urlsplit(link).fragment.split("?", 1)[1])
        assert query["class"] == ["oom"] and query["gpu"] == [pro] and set(query) == {"class", "gpu", "since", "until"}

        # the link opens the page view that lists exactly those five
        await page.goto(link)
        table = page.locator("#failures-table")
        for n in range(5):
            await expect(table.locator(f'tr[data-instance="C.spike{n}"]')).to_contain_text("oom", timeout=POLL_TIMEOUT_MS)
        await expect(table.locator("tr[data-instance]")).to_have_count(5)
        await expect(page.locator("#failures-summary")).to_contain_text(f"5 failures · oom · {pro}")
        for gone in ("C.spike5", "C.other", "C.healthy"):  # after the window's end, another model, a pass
            await expect(table.locator(f'tr[data-instance="{gone}"]')).to_have_count(0)
        await page.screenshot(path=ARTIFACTS / "spike_link_failures_view.png", full_page=True)
        await page.click('tr[data-instance="C.spike0"] a[href="#/instance/C.spike0"]')
        await expect(page.locator("#banner")).to_contain_text("Benchmark failed")
    finally:
        for proc in started:
            kill_group(proc)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(server.stop)
        await receiver.stop()
