"""The built-in page: served by the app, and driven in headless Chromium against the real server.

The browser tests start ``fleetlog serve`` as a subprocess, push the incident of INCIDENT.md
through its HTTP API (C.32733029 on machine 55891, the daemon's OOM), plus a healthy machine 777
at 40 proofs/hour, run the policies, and then use the page as an operator would. Chromium is
Debian's (``apt-get install chromium``, done by ``.ci/run``), driven by Playwright's Python
package; ``FLEETLOG_CHROMIUM`` names another binary. Every browser test leaves a full-page
screenshot in ``tests/artifacts/page/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import datetime as dt
import io
import os
import re
from pathlib import Path

import aiohttp
import pytest
from playwright.async_api import async_playwright, expect

from tests.fleet import OOM_DAEMON_LOG, bench_instance, incident, iso, post, push_lines, utcnow

CHROMIUM = os.environ.get("FLEETLOG_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts" / "page"
POLL_TIMEOUT_MS = 15_000  # longer than the page's slowest refresh (10 s)

XSS_LINE = 'config <script>window.__pwned=1</script> and <img src=x onerror="window.__pwned=2"> done'
XSS_EXCERPT = '<img src=x onerror="window.__pwned=3"><b>not bold</b>'


# ---- the page as files, no browser


async def test_index_is_served_with_min_rate_and_a_content_security_policy(make_client):
    client = await make_client(min_rate=31.5)
    r = await client.get("/")
    assert r.status == 200 and r.content_type == "text/html"
    body = await r.text()
    assert '<meta name="fleetlog-min-rate" content="31.5">' in body
    assert '<script type="module" src="/static/app.js">' in body
    csp = r.headers["Content-Security-Policy"]
    assert "default-src 'self'" in csp and "unsafe-inline" not in csp


async def test_static_files_are_served_with_their_types_and_an_etag(client):
    r = await client.get("/static/app.js")
    assert r.status == 200 and r.content_type == "text/javascript"
    again = await client.get("/static/app.js", headers={"If-None-Match": r.headers["ETag"]})
    assert again.status == 304
    r = await client.get("/static/style.css")
    assert r.status == 200 and r.content_type == "text/css"


@pytest.mark.parametrize("name", ["nope.js", "index.html", "..%2Fapp.py", "%2E%2E%2F%2E%2E%2Fpyproject.toml"])
async def test_unknown_static_names_are_404_in_the_error_shape(client, name):
    r = await client.get(f"/static/{name}")
    assert r.status == 404
    assert (await r.json())["ok"] is False


def test_every_module_import_of_the_page_resolves():
    static = Path(__file__).resolve().parent.parent / "ingest" / "web" / "static"
    for script in static.glob("*.js"):
        for target in re.findall(r'^import .* from "\./([\w.]+)";$', script.read_text(), flags=re.M):
            assert (static / target).is_file(), f"{script.name} imports missing {target}"


# ---- the real server with the incident, and a browser


class Fleet:
    def __init__(self, url: str, http: aiohttp.ClientSession) -> None:
        self.url = url
        self.http = http

    async def get(self, path: str) -> dict:
        async with self.http.get(path) as r:
            assert r.status == 200, await r.text()
            return await r.json()


async def gpu_samples(http, instance_id: str, start: dt.datetime, *, gpus: int = 1, minutes: int = 10,
                      legacy: bool = False) -> None:
    """DCGM-exporter samples every 10 s (memory in MiB, as the agent sends them), or the older gpu_* names."""
    samples = []
    for i in range(0, minutes * 60, 10):
        t = iso(start + dt.timedelta(seconds=i))
        for g in range(gpus):
            used_mib = float(min(i, 500) * 32)
            values = {"util": 100.0 if i > 60 else 5.0, "temp": 40.0 + i / 30, "power": 140.0}
            if legacy:
                named = {"gpu_utilization_percent": values["util"], "gpu_memory_used_bytes": used_mib * 2**20,
                         "gpu_memory_total_bytes": 24.0 * 2**30, "gpu_temperature_celsius": values["temp"],
                         "gpu_power_watts": values["power"]}
            else:
                named = {"DCGM_FI_DEV_GPU_UTIL": values["util"], "DCGM_FI_DEV_FB_USED": used_mib,
                         "DCGM_FI_DEV_FB_FREE": 24576.0 - used_mib, "DCGM_FI_DEV_GPU_TEMP": values["temp"],
                         "DCGM_FI_DEV_POWER_USAGE": values["power"]}
            labels = {"gpu": str(g), "UUID": f"GPU-5f2c-{g}", "modelName": "NVIDIA RTX PRO 4000 Blackwell"}
            samples += [{"name": name, "ts": t, "value": value, "labels": labels} for name, value in named.items()]
    await post(http, "/api/v1/metrics", {"instance_id": instance_id, "samples": samples})


@contextlib.asynccontextmanager
async def incident_server(server_process, *extra: str, push_token: str | None = None):
    """A real server holding the incident (logs complete), a healthy instance and its setup log."""
    server = server_process("--policy-interval", "0", *extra)
    await asyncio.to_thread(server.start)
    headers = {"Authorization": f"Bearer {push_token}"} if push_token else None
    async with aiohttp.ClientSession(base_url=server.url, headers=headers) as http:
        done = utcnow() - dt.timedelta(seconds=30)
        await incident(http, done, logs_complete=True)
        healthy_done = utcnow() - dt.timedelta(hours=1)
        await bench_instance(http, "C.40", 777, done=healthy_done, exit_code=0, rate=40.0, dph=0.8)
        await post(http, "/api/v1/events", {"instance_id": "C.40", "kind": "running", "ts": iso(healthy_done + dt.timedelta(seconds=5))})
        await push_lines(http, "C.40", "setup", ["[entrypoint] tunnels up", XSS_LINE, "[entrypoint] starting curio"], at=healthy_done)
        await post(http, "/api/v1/policy/run", {})
        yield Fleet(server.url, http)


@pytest.fixture
async def fleet(server_process):
    async with incident_server(server_process) as fleet:
        yield fleet


@pytest.fixture
async def page(request):
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"no Chromium at {CHROMIUM}: apt-get install chromium (or set FLEETLOG_CHROMIUM)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = await browser.new_context(viewport={"width": 1400, "height": 1000})
            page = await context.new_page()
            page.on("pageerror", lambda e: errors.append(str(e)))
            yield page
            await page.screenshot(path=ARTIFACTS / f"{request.node.name}.png", full_page=True)
            await context.close()
        finally:
            await browser.close()
    assert errors == [], f"uncaught errors in the page: {errors}"


@pytest.mark.slow
async def test_fleet_view_lists_instances_filters_by_state_and_updates_live(fleet, page):
    await page.goto(fleet.url + "/")
    crashed = page.locator('tr[data-instance="C.32733029"]')
    healthy = page.locator('tr[data-instance="C.40"]')
    await expect(crashed).to_contain_text("RTX PRO 4000")
    for text in ("bench_done", "55891", "oom", "✓ complete"):
        await expect(crashed).to_contain_text(text)
    await expect(crashed.locator('[data-col="rate"]')).to_have_text("—")  # a rate of 0 is no measurement
    for text in ("running", "RTX 4090", "777", "40.0 / 29", "1/1 incomplete"):
        await expect(healthy).to_contain_text(text)

    await page.click('a[data-state="running"]')
    await expect(healthy).to_be_visible()
    await expect(crashed).to_have_count(0)
    assert page.url.endswith("#/fleet?state=running")
    await page.click('a[data-state=""]')
    await expect(crashed).to_be_visible()

    await bench_instance(fleet.http, "C.late", 900, done=utcnow(), exit_code=0, rate=12.5)
    late = page.locator('tr[data-instance="C.late"]')
    await expect(late).to_contain_text("12.5 / 29", timeout=POLL_TIMEOUT_MS)
    await expect(late.locator(".rate")).to_have_class(re.compile(r"\bbad\b"))


@pytest.mark.slow
async def test_crashed_instance_shows_the_oom_banner_timeline_and_benchdaemon_lines(fleet, page):
    await page.goto(fleet.url + "/#/fleet")
    await page.click('tr[data-instance="C.32733029"] a[href="#/instance/C.32733029"]')
    banner = page.locator("#banner")
    await expect(banner).to_contain_text("Benchmark failed")
    await expect(banner.locator('[data-fact="exit code"]')).to_have_text("1")
    await expect(banner.locator('[data-fact="class"]')).to_have_text("oom")
    await expect(banner.locator("pre.excerpt")).to_contain_text("CUDA error: out of memory (cudaErrorMemoryAllocation)")
    await expect(banner.locator(".deciding")).to_contain_text(OOM_DAEMON_LOG[3])

    timeline = page.locator("#timeline")
    for kind in ("registered", "params_done", "bench_started", "bench_done", "logs_complete"):
        await expect(timeline.locator(f'li[data-kind="{kind}"]')).to_have_count(1)
    await expect(timeline.locator('li[data-kind="bench_done"]')).to_contain_text("+10 min")
    # the wrapper's 0 proofs/hour is no measurement: the timeline says so, as the banner and the rules do
    await expect(timeline.locator('li[data-kind="bench_done"]')).to_contain_text("rate not measured")
    await expect(timeline.locator('li[data-kind="bench_done"]')).not_to_contain_text("0.0 proofs/hour")
    await expect(page.locator('#completeness tr[data-source="benchdaemon"]')).to_contain_text("✓ complete")
    await expect(page.locator('#completeness tr[data-source="benchout"]')).to_contain_text("✓ complete")

    await page.click('button.tab[data-source="benchdaemon"]')
    lines = page.locator("#log-lines .ln")
    await expect(lines).to_have_count(len(OOM_DAEMON_LOG))
    await expect(lines.nth(3)).to_contain_text("CUDA error: out of memory")
    await expect(lines.nth(3)).to_have_class(re.compile(r"\balarm\b"))
    assert page.url.endswith("#/instance/C.32733029?source=benchdaemon")

    await page.fill("#log-search", "out of memory")
    await page.press("#log-search", "Enter")
    await expect(lines).to_have_count(1)
    await expect(lines.locator("mark")).to_have_text("out of memory")

    await page.click('button.tab[data-source="all"]')
    await expect(lines).to_have_count(1)  # the search applies to every source
    await page.fill("#log-search", "")
    await page.press("#log-search", "Enter")
    await expect(lines).to_have_count(len(OOM_DAEMON_LOG) + 4)


@pytest.mark.slow
async def test_log_line_and_excerpt_with_markup_render_as_text(fleet, page):
    await bench_instance(fleet.http, "C.evil", 901, done=utcnow(), exit_code=3, rate=0.0,
                         gpu_model="<b>GPU</b><script>window.__pwned=4</script>", excerpt=XSS_EXCERPT)
    await page.goto(fleet.url + "/#/instance/C.40?source=setup")
    line = page.locator('#log-lines .ln[data-seq="1"] .txt')
    await expect(line).to_have_text(XSS_LINE)
    await expect(line).to_be_visible()
    await expect(page.locator("#log-lines script, #log-lines img")).to_have_count(0)

    await page.fill("#log-search", "pwned")  # highlighting splits the text: still text
    await page.press("#log-search", "Enter")
    await expect(line.locator("mark")).to_have_count(2)
    await expect(line).to_have_text(XSS_LINE)
    await expect(page.locator("#log-lines script, #log-lines img")).to_have_count(0)

    await page.goto(fleet.url + "/#/instance/C.evil")
    await expect(page.locator("#banner pre.excerpt")).to_have_text(XSS_EXCERPT)
    await expect(page.locator("#view")).to_contain_text("<b>GPU</b><script>window.__pwned=4</script>")
    await page.goto(fleet.url + "/#/fleet")
    await expect(page.locator('tr[data-instance="C.evil"]')).to_contain_text("<b>GPU</b>")
    await expect(page.locator("#view script, #view img, #view b")).to_have_count(0)
    assert await page.evaluate("typeof window.__pwned") == "undefined"


@pytest.mark.slow
async def test_load_older_pages_back_by_seq_and_live_tail_follows_new_lines(fleet, page):
    at = utcnow() - dt.timedelta(minutes=5)
    await push_lines(fleet.http, "C.40", "benchout", [f"proof {i} done in 140 s" for i in range(450)], at=at)
    await page.goto(fleet.url + "/#/instance/C.40?source=benchout")
    lines = page.locator("#log-lines .ln")
    await expect(lines).to_have_count(200)
    await expect(lines.first).to_have_attribute("data-seq", "250")
    await expect(lines.last).to_have_attribute("data-seq", "449")

    await page.click("#log-older")
    await expect(lines).to_have_count(400)
    await expect(lines.first).to_have_attribute("data-seq", "50")
    await page.click("#log-older")
    await expect(lines).to_have_count(450)
    await expect(lines.first).to_have_attribute("data-seq", "0")
    await expect(page.locator("#log-older")).to_be_disabled()
    await expect(page.locator("#log-status")).to_contain_text("from the first line")

    await page.check("#log-follow")
    await push_lines(fleet.http, "C.40", "benchout", ["proof 450 done", "proof 451 done", "benchmark finished"], start=450, at=utcnow())
    await expect(lines.last).to_have_attribute("data-seq", "452", timeout=POLL_TIMEOUT_MS)
    await expect(lines.last).to_contain_text("benchmark finished")
    await expect(lines).to_have_count(453)

    await page.click('button.tab[data-source="all"]')
    await expect(page.locator("#log-follow")).to_be_disabled()
    await expect(lines).to_have_count(200)
    await page.click("#log-older")  # across sources: a longer tail
    await expect(lines).to_have_count(400)


@pytest.mark.slow
async def test_gpu_charts_draw_every_gpu_over_the_benchmark(fleet, page):
    await gpu_samples(fleet.http, "C.32733029", utcnow() - dt.timedelta(minutes=11), gpus=2)
    await page.goto(fleet.url + "/#/instance/C.32733029")
    charts = page.locator("#charts")
    for metric in ("utilization", "memory", "temperature", "power"):
        await expect(charts.locator(f'figure[data-metric="{metric}"] polyline.series')).to_have_count(2)
    await expect(charts.locator('figure[data-metric="utilization"] figcaption')).to_contain_text("peak 100 %")
    memory = charts.locator('figure[data-metric="memory"]')
    await expect(memory).to_have_attribute("data-source-metric", "DCGM_FI_DEV_FB_USED")
    await expect(memory.locator("figcaption")).to_contain_text("peak 15.6 GiB")  # 16000 MiB
    await expect(memory.locator(".axis").first).to_have_text("0 B")
    await expect(memory).to_contain_text("24.0 GiB")  # used + free
    await expect(charts.locator("rect.bench-window")).to_have_count(4)


@pytest.mark.slow
async def test_gpu_charts_read_the_older_metric_names_too(fleet, page):
    await gpu_samples(fleet.http, "C.40", utcnow() - dt.timedelta(hours=1, minutes=11), legacy=True)
    await page.goto(fleet.url + "/#/instance/C.40")
    memory = page.locator('#charts figure[data-metric="memory"]')
    await expect(memory).to_have_attribute("data-source-metric", "gpu_memory_used_bytes")
    await expect(memory.locator("polyline.series")).to_have_count(1)
    await expect(memory).to_contain_text("24.0 GiB")


@pytest.mark.slow
async def test_exclude_and_include_change_eligibility_through_the_api(fleet, page):
    await page.goto(fleet.url + "/#/machines")
    await expect(page.locator('tr[data-machine="55891"]')).to_contain_text("not eligible")
    await expect(page.locator('tr[data-machine="55891"]')).to_contain_text("oom")
    await expect(page.locator('tr[data-machine="777"] [data-eligible]')).to_have_text("eligible")

    await page.click('tr[data-machine="777"] a')
    summary = page.locator("#machine-summary")
    await expect(summary.locator("[data-eligible]")).to_have_text("eligible")
    await expect(summary.locator('[data-fact="best rate"]')).to_contain_text("40.0")
    await expect(summary.locator('[data-fact="$/proof"]')).to_have_text("$0.0200")
    await expect(page.locator("#machine-instances")).to_contain_text("C.40")

    await page.fill("#verdict-reason", "flaky PSU")
    await page.click("#exclude")
    await expect(page.locator("#verdict-result")).to_contain_text("now not eligible")
    await expect(summary.locator('[data-fact="why"]')).to_have_text("operator exclude: flaky PSU")
    host = await fleet.get("/api/v1/hosts/777")
    assert (host["eligible"], host["bad"], host["verdict_by"], host["reason"]) == (False, True, "operator", "operator exclude: flaky PSU")

    await page.fill("#verdict-reason", "PSU replaced")
    await page.click("#include")
    await expect(page.locator("#verdict-result")).to_contain_text("now eligible")
    host = await fleet.get("/api/v1/hosts/777")
    assert (host["eligible"], host["bad"], host["reason"]) == (True, False, "operator include: PSU replaced")


@pytest.mark.slow
async def test_decisions_view_shows_rule_evidence_and_state(fleet, page):
    await page.goto(fleet.url + "/#/decisions")
    rows = page.locator("#decisions-table tbody tr")
    await expect(rows).to_have_count(2)
    destroy = rows.filter(has_text="destroy_below_min_rate")
    await expect(destroy).to_contain_text("C.32733029")
    await expect(destroy).to_contain_text("proposed")
    await destroy.locator("summary").click()
    evidence = destroy.locator("pre.evidence")
    await expect(evidence).to_contain_text('"failure_class": "oom"')
    await expect(evidence).to_contain_text('"waited_for": "logs_complete"')
    await expect(rows.filter(has_text="bad_hosts")).to_contain_text("executed")

    await page.select_option("#decisions-action", "destroy")
    await expect(rows).to_have_count(1)
    assert page.url.endswith("#/decisions?action=destroy")


@pytest.mark.slow
async def test_a_stored_token_goes_with_every_request_as_bearer(fleet, page):
    seen: list[dict] = []
    page.on("request", lambda r: seen.append(r.headers) if "/api/" in r.url else None)
    await page.goto(fleet.url + "/#/fleet")
    await expect(page.locator('tr[data-instance="C.40"]')).to_be_visible()
    assert seen and all("authorization" not in h for h in seen)

    await page.fill("#token-input", "s3cret-read")
    async with page.expect_request(lambda r: r.url.endswith("/api/v1/instances")) as list_request:
        await page.click("#token-form button")
    assert (await (await list_request.value).all_headers())["authorization"] == "Bearer s3cret-read"
    await expect(page.locator("#token-state")).to_have_text("set")
    assert await page.evaluate("localStorage.getItem('fleetlog.token')") == "s3cret-read"

    async with page.expect_request(lambda r: "/api/v1/instances/C.40" in r.url) as detail_request:
        await page.click('a[href="#/instance/C.40"]')
    assert (await (await detail_request.value).all_headers())["authorization"] == "Bearer s3cret-read"


@pytest.mark.slow
async def test_with_tokens_on_the_page_loads_and_reads_with_the_read_token_and_acts_with_the_admin_token(server_process, page):
    tokens = ("--read-token", "r3ad-token", "--admin-token", "adm1n-token", "--enroll-token", "enr0ll-token")
    async with incident_server(server_process, *tokens, push_token="adm1n-token") as fleet:
        await page.goto(fleet.url + "/#/fleet")
        await expect(page.locator("#error")).to_contain_text("set the token above")
        await expect(page.locator('tr[data-instance="C.40"]')).to_have_count(0)

        await page.fill("#token-input", "r3ad-token")
        await page.click("#token-form button")
        await expect(page.locator('tr[data-instance="C.32733029"]')).to_contain_text("oom")
        await expect(page.locator("#error")).to_be_hidden()

        await page.goto(fleet.url + "/#/machine/777")
        await expect(page.locator("#machine-summary [data-eligible]")).to_have_text("eligible")
        await page.click("#exclude")
        await expect(page.locator("#error")).to_contain_text("admin token")
        assert (await fleet.get("/api/v1/hosts/777"))["eligible"] is True

        await page.fill("#token-input", "adm1n-token")
        await page.click("#token-form button")
        await expect(page.locator("#machine-summary [data-eligible]")).to_have_text("eligible")
        await page.click("#exclude")
        await expect(page.locator("#verdict-result")).to_contain_text("now not eligible")
        assert (await fleet.get("/api/v1/hosts/777"))["eligible"] is False


async def test_the_canned_questions_are_listed_with_their_parameters(client):
    r = await client.get("/api/v1/queries")
    assert r.status == 200
    queries = {q["name"]: q for q in (await r.json())["queries"]}
    assert {"why_failed", "hosts", "log_volume", "machine_leaderboard"} <= set(queries)
    assert queries["why_failed"]["params"] == ["instance_id"] and "why did this instance fail" in queries["why_failed"]["description"]
    assert queries["hosts"]["sql"].startswith('WITH "host_performance" AS')  # what it needs, in front
    assert not any(name.startswith(("10_", "20_")) for name in queries)  # not the rules


@pytest.mark.slow
async def test_search_box_finds_a_line_across_the_fleet_and_opens_it_in_its_log(fleet, page):
    await page.goto(fleet.url + "/#/fleet")
    await page.fill("#search-input", "OUT OF MEMORY")
    await page.press("#search-input", "Enter")
    hits = page.locator("#search-hits tr.hit")
    await expect(hits).to_have_count(1)
    hit = hits.first
    await expect(hit).to_contain_text("C.32733029")
    await expect(hit).to_contain_text("benchdaemon")
    await expect(hit.locator("mark")).to_have_text("out of memory")
    assert "#/search?q=OUT+OF+MEMORY" in page.url

    await page.fill("#search-q", "<script")  # a log line with markup is found, and shown as text
    await page.press("#search-q", "Enter")
    await expect(page.locator("#search-hits tr.hit")).to_have_count(1)
    await expect(page.locator("#search-hits td.line")).to_have_text(XSS_LINE)
    assert await page.evaluate("typeof window.__pwned") == "undefined"

    await page.fill("#search-q", r"cuda error: \w+ of memory")
    await page.check("#search-regex")
    await page.click("#search-form-view button")
    await expect(page.locator("#search-hits tr.hit")).to_have_count(1)
    await page.click("#search-hits a.hit-line")
    assert "#/instance/C.32733029?source=benchdaemon&run=0&seq=3" in page.url
    focused = page.locator("#log-lines .ln.focus")
    await expect(focused).to_have_count(1)
    await expect(focused).to_contain_text(OOM_DAEMON_LOG[3])
    await expect(page.locator("#log-lines .ln")).to_have_count(len(OOM_DAEMON_LOG))  # before and after it

    await page.goto(fleet.url + "/#/search?q=%28unclosed&regex=1")
    await expect(page.locator("#error")).to_contain_text("regular expression")


@pytest.mark.slow
async def test_query_page_runs_a_canned_question_and_free_sql_and_downloads_csv(fleet, page):
    await page.goto(fleet.url + "/#/query")
    await page.select_option("#query-pick", "why_failed")
    await expect(page.locator("#query-about")).to_contain_text("why did this instance fail")
    await expect(page.locator("#query-sql")).to_have_value(re.compile(r"\$instance_id"))
    await page.fill('#query-params input[name="instance_id"]', "C.32733029")
    await page.click("#query-run")
    result = page.locator("#query-result")
    await expect(result.locator("tbody tr")).to_have_count(1)
    await expect(result.locator("thead")).to_contain_text("failure_class")
    await expect(result.locator("tbody")).to_contain_text("oom")

    await page.fill("#query-sql", "SELECT source, count(*) AS n FROM logs GROUP BY source ORDER BY source")
    await page.click("#query-run")
    await expect(result.locator("tbody tr")).to_have_count(3)
    async with page.expect_download() as download_info:
        await page.click("#query-csv")
    download = await download_info.value
    csv_text = Path(await download.path()).read_text()
    assert csv_text.splitlines() == ["source,n", "benchdaemon,5", "benchout,4", "setup,3"]

    await page.fill("#query-sql", "DELETE FROM logs")  # the read-only SQL API refuses it
    await page.click("#query-run")
    await expect(page.locator("#error")).to_contain_text("only SELECT")
    assert len((await fleet.get("/api/v1/instances/C.40/logs?source=setup"))["lines"]) == 3


FORMULAS = ['=HYPERLINK("http://x","y")', "+1+1", "-2+3", "@SUM(A1)", "\t=1+1", "\r=1+1", "plain; =1+1", "-5"]


@pytest.mark.slow
async def test_query_page_csv_neutralises_formulas_while_the_api_csv_stays_exact(fleet, page):
    await push_lines(fleet.http, "C.40", "notes", FORMULAS, at=utcnow())
    sql = "SELECT line, -1 AS n FROM logs WHERE source = 'notes' ORDER BY seq"
    await page.goto(fleet.url + "/#/query")
    await page.fill("#query-sql", sql)
    await page.click("#query-run")
    await expect(page.locator("#query-result tbody tr")).to_have_count(len(FORMULAS))
    async with page.expect_download() as download_info:
        await page.click("#query-csv")
    download = await download_info.value
    cells = list(csv.reader(io.StringIO(Path(await download.path()).read_bytes().decode(), newline="")))
    assert cells[0] == ["line", "n"]
    assert [row[0] for row in cells[1:]] == ["'" + line if line[0] in "=+-@\t\r" and line != "-5" else line
                                              for line in FORMULAS]
    assert {row[1] for row in cells[1:]} == {"-1"}  # numbers stay numbers

    async with fleet.http.post("/api/v1/query?format=csv", json={"sql": sql}) as r:  # for programs: exact
        assert r.status == 200
        exact = list(csv.reader(io.StringIO(await r.text(), newline="")))
    assert [row[0] for row in exact[1:]] == FORMULAS
