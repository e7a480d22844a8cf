"""The page on a phone and at a desk, and the triage view that opens it.

Driven in Debian's Chromium against a real server, with the fixtures of tests/test_page.py: every
view at 390 px (a phone) and 1280 px fits its width (no sideways scroll of the document), the OOM
instance's failure banner is on screen without scrolling, a search hit opens scrolled into view, the
timeline says what the GPU said, a failed parameter fetch has its banner, and the triage view counts,
filters and sorts with everything in the URL.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from urllib.parse import parse_qs, urlsplit

import pytest
from playwright.async_api import Error as PlaywrightError
from playwright.async_api import expect

from tests.fleet import OOM_DAEMON_LOG, demo_fleet, iso, params_failure, post, utcnow
from tests.test_page import POLL_TIMEOUT_MS, fleet, gpu_samples, page  # noqa: F401 (fixtures)

VIEWPORTS = {390: 844, 1280: 900}


async def sized(page, width: int) -> None:  # noqa: F811
    await page.set_viewport_size({"width": width, "height": VIEWPORTS[width]})


async def document_width(page) -> int:  # noqa: F811
    return await page.evaluate("document.documentElement.scrollWidth")


async def in_viewport(page, locator) -> bool:  # noqa: F811
    box = await locator.bounding_box()
    size = page.viewport_size
    return (box is not None and box["x"] >= 0 and box["y"] >= 0
            and box["x"] + box["width"] <= size["width"] + 0.5 and box["y"] + box["height"] <= size["height"] + 0.5)


async def scrolled_on_screen(page, locator, timeout_s: float = 10) -> bool:  # noqa: F811
    """Scrolled to, the element lies inside the viewport (retried: a refresh may redraw it meanwhile)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            await locator.scroll_into_view_if_needed(timeout=2000)
            if await in_viewport(page, locator):
                return True
        except PlaywrightError:
            pass
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.2)


@pytest.mark.slow
@pytest.mark.parametrize("width", sorted(VIEWPORTS))
async def test_every_view_fits_the_width_without_sideways_scroll(fleet, page, width):  # noqa: F811
    await params_failure(fleet.http, "C.params", 780, at=utcnow())
    await gpu_samples(fleet.http, "C.32733029", utcnow() - dt.timedelta(minutes=11))
    await sized(page, width)
    views = {
        "/#/fleet": '#fleet-table [data-instance="C.32733029"]',
        "/#/decisions": "#decisions-table tbody tr",
        "/#/machines": '#machines-table [data-machine="55891"]',
        "/#/machine/55891": "#machine-decisions tbody tr",
        "/#/instance/C.32733029": '#charts figure[data-metric="power"]',
        "/#/instance/C.32733029?source=benchdaemon": "#log-lines .ln.alarm",
        "/#/instance/C.params": '#timeline li[data-kind="params_done"]',
        "/#/search?q=out+of+memory": "#search-hits tr.hit",
        "/#/failures?class=oom": '#failures-table [data-instance="C.32733029"]',
    }
    widths = {}
    for route, ready in views.items():
        await page.goto(fleet.url + route)
        await expect(page.locator(ready).first).to_be_visible()
        widths[route] = await document_width(page)
    await page.goto(fleet.url + "/#/query")
    await page.select_option("#query-pick", "why_failed")
    await page.fill('#query-params input[name="instance_id"]', "C.32733029")
    await page.click("#query-run")
    await expect(page.locator("#query-result tbody tr")).to_have_count(1)
    widths["/#/query"] = await document_width(page)
    assert {route: w for route, w in widths.items() if w > width} == {}, widths

    await page.goto(fleet.url + "/#/fleet")  # the failure of a failed instance is on screen, not off to the right
    failure = page.locator('#fleet-table [data-instance="C.32733029"] .badge.class')
    await expect(failure).to_have_text("oom")
    assert await scrolled_on_screen(page, failure), await failure.bounding_box()
    await page.goto(fleet.url + "/#/instance/C.32733029?source=benchdaemon")  # log lines wrap at a readable width
    text = page.locator("#log-lines .ln.alarm .txt").first
    await expect(text).to_contain_text("out of memory")
    assert (await text.bounding_box())["width"] >= min(width - 80, 600)


@pytest.mark.slow
@pytest.mark.parametrize("width", sorted(VIEWPORTS))
async def test_oom_instance_failure_banner_is_on_screen_without_scrolling(fleet, page, width):  # noqa: F811
    await gpu_samples(fleet.http, "C.32733029", utcnow() - dt.timedelta(minutes=11))
    await sized(page, width)
    await page.goto(fleet.url + "/#/instance/C.32733029")
    banner = page.locator("#banner .banner.fail")
    await expect(banner.locator('[data-fact="class"]')).to_have_text("oom")
    await expect(page.locator('#charts figure[data-metric="power"]')).to_be_visible()
    assert await page.evaluate("window.scrollY") == 0
    assert await in_viewport(page, banner), (await banner.bounding_box(), page.viewport_size)
    await page.screenshot(path=f"/tmp/k-page/instance-oom-{width}.png")


@pytest.mark.slow
@pytest.mark.parametrize("width", sorted(VIEWPORTS))
async def test_search_hit_opens_its_line_scrolled_into_view(fleet, page, width):  # noqa: F811
    await gpu_samples(fleet.http, "C.32733029", utcnow() - dt.timedelta(minutes=11), gpus=2)
    await sized(page, width)
    await page.goto(fleet.url + "/#/search?q=out+of+memory")
    await page.click("#search-hits a.hit-line")
    focused = page.locator("#log-lines .ln.focus")
    await expect(focused).to_contain_text(OOM_DAEMON_LOG[3])
    await expect(page.locator('#charts figure[data-metric="power"]')).to_be_visible()  # what grows above it
    await page.wait_for_timeout(500)  # layout after the charts drew
    assert await in_viewport(page, focused), (await focused.bounding_box(), page.viewport_size)


@pytest.mark.slow
async def test_oom_instance_says_its_rate_was_not_measured_as_the_fleet_list_does(fleet, page):  # noqa: F811
    """The wrapper reports 0 proofs/hour for a run that measured nothing (INCIDENT.md): the rules, the
    fleet list and ``fleetlog why`` read 0 as no measurement; the instance view says so too."""
    await page.goto(fleet.url + "/#/fleet")
    await expect(page.locator('#fleet-table [data-instance="C.32733029"] [data-col="rate"]')).to_have_text("—")
    await page.goto(fleet.url + "/#/instance/C.32733029")
    rate = page.locator('#banner .banner.fail [data-fact="rate"]')
    await expect(rate).to_have_text("not measured (min_rate 29)")
    run = page.locator("#bench-runs tbody tr").first
    await expect(run).to_contain_text("oom")
    await expect(run).not_to_contain_text("0.0 / 29")


@pytest.mark.slow
async def test_lifecycle_details_stay_inside_their_card_on_a_phone(fleet, page):  # noqa: F811
    await sized(page, 390)
    await page.goto(fleet.url + "/#/instance/C.32733029")
    await expect(page.locator('#timeline li[data-kind="bench_started"] .ev-detail')).to_contain_text("partition-workers")
    card = await page.locator("#timeline").bounding_box()
    spilled = await page.locator("#timeline li").evaluate_all(
        """(items, right) => items.flatMap(li => [...li.children]).filter(el => el.getBoundingClientRect().right > right + 0.5)
                                  .map(el => `${el.closest('li').dataset.kind}: ${el.textContent}`)""", card["x"] + card["width"])
    assert spilled == [], spilled


@pytest.mark.slow
async def test_timeline_shows_the_gpu_state_and_its_reason(fleet, page):  # noqa: F811
    await post(fleet.http, "/api/v1/events", {"instance_id": "C.32733029", "kind": "gpu_state", "ts": iso(utcnow()),
                                              "state": "gpu_lost", "gpu": "0", "reason": "Xid 79: GPU has fallen off the bus"})
    await page.goto(fleet.url + "/#/instance/C.32733029")
    row = page.locator('#timeline li[data-kind="gpu_state"]')
    await expect(row).to_contain_text("gpu_lost")
    await expect(row).to_contain_text("Xid 79: GPU has fallen off the bus")
    await expect(row).to_contain_text("GPU 0")


@pytest.mark.slow
async def test_failed_parameter_fetch_shows_the_failure_banner_with_its_exit_code(fleet, page):  # noqa: F811
    await params_failure(fleet.http, "C.params", 780, at=utcnow(), exit_code=2)
    await page.goto(fleet.url + "/#/instance/C.params")
    banner = page.locator("#banner .banner.fail")
    await expect(banner).to_contain_text("Parameter fetch failed")
    await expect(banner.locator('[data-fact="exit code"]')).to_have_text("2")
    await expect(banner.locator('[data-fact="class"]')).to_have_text("param_fetch")
    await expect(banner.locator('[data-fact="phase"]')).to_have_text("params")
    await page.goto(fleet.url + "/#/fleet")
    row = page.locator('#fleet-table [data-instance="C.params"]')
    await expect(row.locator('[data-col="failure"]')).to_contain_text("params")


# ---- the triage view


@pytest.fixture
async def demo(server_process):
    import aiohttp
    # hung is judged by the server's clock: a 1 s timeout makes C.hung hung a second after it arrived
    server = server_process("--policy-interval", "0", "--bench-timeout-s", "1")
    import asyncio
    await asyncio.to_thread(server.start)
    async with aiohttp.ClientSession(base_url=server.url) as http:
        await demo_fleet(http, utcnow() - dt.timedelta(seconds=30))
        deadline = asyncio.get_running_loop().time() + 60
        while not any(i["instance_id"] == "C.hung" and i["outcome"] == "hung"
                      for i in (await api_json(http, "/api/v1/instances"))["instances"]):
            assert asyncio.get_running_loop().time() < deadline, "C.hung never hung"
            await asyncio.sleep(0.1)
        await post(http, "/api/v1/policy/run", {})
        yield server.url, http


async def api_json(http, path):
    async with http.get(path) as r:
        assert r.status == 200
        return await r.json()


def row_ids(page):  # noqa: F811
    return page.locator("#fleet-table tbody tr[data-instance]").evaluate_all("rows => rows.map(r => r.dataset.instance)")


def hash_params(url: str) -> dict:
    fragment = urlsplit(url).fragment
    return {k: v[0] for k, v in parse_qs(fragment.partition("?")[2]).items()}


@pytest.mark.slow
@pytest.mark.parametrize("width", sorted(VIEWPORTS))
async def test_triage_opens_the_page_with_counts_and_the_worst_first(demo, page, width):  # noqa: F811
    url, http = demo
    instances = (await api_json(http, "/api/v1/instances"))["instances"]
    proposed = (await api_json(http, "/api/v1/decisions?state=proposed"))["decisions"]
    hosts = (await api_json(http, "/api/v1/hosts"))["hosts"]
    destroy = {d["subject"] for d in proposed if d["action"] == "destroy"}
    expected = {
        "failing": sum(1 for i in instances if i.get("failing", i["failed_phase"] is not None or i["outcome"] == "below_min_rate")
                       and i["state"] != "killed"),
        "destroy": len(destroy),
        "excluded": sum(1 for m in hosts if m["bad"]),
        "incomplete": sum(1 for i in instances if i["logs"] and i["logs"]["incomplete"]),
        # the instance list's unproven (the unproven_burn view, tests/test_money.py): one definition
        "burning": "$%.2f" % sum(i["dph"] or 0 for i in instances if i["unproven"]),
    }
    assert destroy and expected["excluded"] and expected["incomplete"] and expected["failing"]
    assert expected["burning"] != "$0.00"
    await sized(page, width)
    await page.goto(url + "/")
    for key, n in expected.items():
        await expect(page.locator(f'#counts [data-count="{key}"] .n')).to_have_text(str(n), timeout=POLL_TIMEOUT_MS)
    ids = await row_ids(page)
    assert set(ids) == {i["instance_id"] for i in instances}
    first = ids[: len(destroy)]
    assert set(first) == destroy, ids  # failing with a destroy proposed, on top
    assert ids.index("C.40") > ids.index("C.hung") and ids.index("C.40") > ids.index("C.params")
    assert await document_width(page) <= width
    failure = page.locator(f'#fleet-table tbody tr[data-instance="{ids[0]}"] [data-col="failure"]')
    assert await page.evaluate("window.scrollY") == 0
    assert await in_viewport(page, failure), (await failure.bounding_box(), width)  # what the worst one failed of, unscrolled
    await page.screenshot(path=f"/tmp/k-page/triage-{width}.png")


@pytest.mark.slow
async def test_triage_filters_and_sorting_live_in_the_url(demo, page):  # noqa: F811
    url, http = demo
    await sized(page, 1280)
    await page.goto(url + "/#/fleet")
    await expect(page.locator("#fleet-table tbody tr[data-instance]")).to_have_count(9)  # tests/fleet.py demo_fleet
    await page.select_option("#filter-outcome", "failed")
    await expect(page.locator("#fleet-table tbody tr[data-instance]")).to_have_count(2)
    assert hash_params(page.url) == {"outcome": "failed"}
    assert sorted(await row_ids(page)) == ["C.32733029", "C.drop"]

    await page.select_option("#filter-outcome", "")
    await page.select_option("#filter-machine", "777")
    await expect(page.locator("#fleet-table tbody tr[data-instance]")).to_have_count(2)
    await page.click('#fleet-table th[data-sort="rate"] a')
    assert hash_params(page.url) == {"machine": "777", "sort": "rate"}
    await expect(page.locator("#fleet-table tbody tr[data-instance]").first).to_have_attribute("data-instance", "C.31")
    await page.click('#fleet-table th[data-sort="rate"] a')
    assert hash_params(page.url) == {"machine": "777", "sort": "rate", "dir": "desc"}
    await expect(page.locator("#fleet-table tbody tr[data-instance]").first).to_have_attribute("data-instance", "C.40")

    pasted = url + "/#/fleet?phase=params&sort=instance"  # a link pasted into a chat opens the same list
    await page.goto("about:blank")
    await page.goto(pasted)
    await expect(page.locator("#fleet-table tbody tr[data-instance]")).to_have_count(1)
    await expect(page.locator("#filter-phase")).to_have_value("params")
    for column in ("instance", "state", "outcome", "gpu", "machine", "location", "rate", "exit", "failure", "logs", "last_seen"):
        await expect(page.locator(f'#fleet-table th[data-sort="{column}"] a')).to_have_count(1)
    for name in ("state", "outcome", "class", "phase", "gpu", "machine", "location"):
        await expect(page.locator(f"#filter-{name}")).to_have_count(1)
    await page.click('#counts [data-count="destroy"] a')
    assert hash_params(page.url) == {"look": "destroy"}
    await expect(page.locator("#fleet-table tbody tr[data-instance]")).to_have_count(
        len({d["subject"] for d in (await api_json(http, "/api/v1/decisions?state=proposed"))["decisions"] if d["action"] == "destroy"}))


@pytest.mark.slow
async def test_triage_every_filter_and_every_sort_is_kept_in_a_pasted_link(demo, page):  # noqa: F811
    url, http = demo
    await post(http, "/api/v1/events", {"instance_id": "C.loc", "kind": "registered", "ts": iso(utcnow()), "machine_id": 790,
                                        "gpu_model": "RTX 4090", "gpu_count": 1, "dph": 0.3, "location": "DE"})
    instances = {i["instance_id"]: i for i in (await api_json(http, "/api/v1/instances"))["instances"]}
    rows = page.locator("#fleet-table tbody tr[data-instance]")
    await sized(page, 1280)
    fields = {"outcome": "outcome", "class": "failure_class", "phase": "failed_phase", "gpu": "gpu_model",
              "machine": "machine_id", "location": "location"}
    for key, field in fields.items():
        await page.goto(url + "/#/fleet")
        await expect(rows).to_have_count(len(instances), timeout=POLL_TIMEOUT_MS)
        values = [v for v in await page.locator(f"#filter-{key} option").evaluate_all("os => os.map(o => o.value)") if v]
        assert values, key
        value = values[0]
        await page.select_option(f"#filter-{key}", value)
        wanted = sorted(i for i, doc in instances.items() if str(doc[field]) == value)
        await expect(rows).to_have_count(len(wanted), timeout=POLL_TIMEOUT_MS)
        assert hash_params(page.url) == {key: value}, (key, page.url)
        assert sorted(await row_ids(page)) == wanted, key
        pasted = page.url
        await page.goto("about:blank")
        await page.goto(pasted)  # the same list from the link alone
        await expect(page.locator(f"#filter-{key}")).to_have_value(value)
        await expect(rows).to_have_count(len(wanted))
    await page.goto(url + "/#/fleet")
    state = page.locator('#filter-state a[data-state="bench_done"]')
    await state.click()
    assert hash_params(page.url) == {"state": "bench_done"}
    await expect(rows).to_have_count(sum(1 for i in instances.values() if i["state"] == "bench_done"))

    columns = await page.locator("#fleet-table thead th[data-sort]").evaluate_all("ths => ths.map(t => t.dataset.sort)")
    assert columns[-1] == "worst" and len(columns) == 12, columns  # the eleven columns, and worst first (a phone's)
    for column in columns[:-1]:
        first, second = ("descending", "ascending") if column == "last_seen" else ("ascending", "descending")  # newest first
        for clicks, direction in ((1, first), (2, second)):
            await page.goto(url + "/#/fleet")
            await expect(rows).to_have_count(len(instances), timeout=POLL_TIMEOUT_MS)
            for _ in range(clicks):
                await page.click(f'#fleet-table th[data-sort="{column}"] a')
            assert hash_params(page.url).get("sort") == column, page.url
            header = page.locator(f'#fleet-table th[data-sort="{column}"]')
            await expect(header).to_have_attribute("aria-sort", direction)
            order = await row_ids(page)
            pasted = page.url
            await page.goto("about:blank")
            await page.goto(pasted)
            await expect(header).to_have_attribute("aria-sort", direction)
            await expect(rows).to_have_count(len(instances), timeout=POLL_TIMEOUT_MS)
            assert await row_ids(page) == order, (column, direction)
    await sized(page, 390)  # cards: the headers are the sort chips, worst first among them
    await page.goto(url + "/#/fleet?sort=rate&dir=desc")
    await page.click('#fleet-table th[data-sort="worst"] a')
    assert hash_params(page.url) == {}, page.url
