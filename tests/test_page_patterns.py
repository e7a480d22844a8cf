"""The page's failure patterns (#/patterns, #/patterns?id=) and the instance's "compared with a healthy
run" panel, in Debian's Chromium against a real server holding three OOMs of one pattern on three
machines and a healthy run of the first one's GPU model (tests/test_patterns.py's oom_fleet)."""

from __future__ import annotations

import asyncio
import datetime as dt

import aiohttp
import pytest
from playwright.async_api import expect

from tests.fleet import utcnow
from tests.test_page import POLL_TIMEOUT_MS, page  # noqa: F401 (fixture)
from tests.test_patterns import HEALTHY_DAEMON, oom_fleet


@pytest.fixture
async def patterns_server(server_process):
    server = server_process("--policy-interval", "0")
    await asyncio.to_thread(server.start)
    async with aiohttp.ClientSession(base_url=server.url) as http:
        await oom_fleet(http, utcnow() - dt.timedelta(seconds=30))
        async with http.post("/api/v1/policy/run", json={}) as r:
            assert r.status == 200, await r.text()
        yield server.url


@pytest.mark.slow
async def test_patterns_view_groups_the_three_ooms_and_lists_who_shares_them(patterns_server, page):  # noqa: F811
    await page.goto(patterns_server + "/#/patterns")
    row = page.locator("#patterns-table tr[data-pattern]")
    await expect(row).to_have_count(1, timeout=POLL_TIMEOUT_MS)
    await expect(row.locator("td[data-machines]")).to_have_attribute("data-machines", "3")
    for text in ("allocating <size> for NTT (request <uuid>, buffer <hex>)", "41003 55891 55892", "RTX PRO 4000",
                 "570.124.06", "v1.3.2", "oom"):
        await expect(row).to_contain_text(text)
    await row.locator("a.template").click()
    listed = page.locator("#pattern-failures tr[data-instance]")
    await expect(listed).to_have_count(3, timeout=POLL_TIMEOUT_MS)
    await expect(page.locator("code.template")).to_contain_text("allocating <size> for NTT")
    await expect(page.locator('#pattern-failures tr[data-instance="C.p2"]')).to_contain_text("21.4 GiB")
    assert "#/patterns?id=" in page.url
    await page.set_viewport_size({"width": 390, "height": 844})  # a phone: cards, no sideways scroll
    await page.goto(patterns_server + "/#/patterns")
    await expect(page.locator("#patterns-table tr[data-pattern]")).to_have_count(1, timeout=POLL_TIMEOUT_MS)
    assert await page.evaluate("document.documentElement.scrollWidth") <= 390


@pytest.mark.slow
async def test_failed_instance_shows_where_it_parts_from_the_healthy_run_of_its_model(patterns_server, page):  # noqa: F811
    await page.goto(patterns_server + "/#/instance/C.p1")
    panel = page.locator("#run-diff")
    await expect(panel).to_be_visible(timeout=POLL_TIMEOUT_MS)
    await expect(panel.locator("#diff-healthy")).to_have_text("C.ok")
    source = panel.locator('.diff-source[data-source="benchdaemon"]')
    await expect(source.locator("[data-parted-at]")).to_have_attribute("data-parted-at", "3")
    await expect(source.locator("tr.diff-failed").first).to_contain_text("out of memory")
    await expect(source.locator("tr.diff-healthy").first).to_contain_text(HEALTHY_DAEMON[2])
    await page.goto(patterns_server + "/#/instance/C.p2")  # no RTX 4090 passed
    await expect(page.locator("#run-diff")).to_contain_text("nothing to compare with", timeout=POLL_TIMEOUT_MS)
    await page.goto(patterns_server + "/#/instance/C.ok")  # passed: no panel
    await expect(page.locator("#instance-id")).to_have_text("C.ok", timeout=POLL_TIMEOUT_MS)
    await expect(page.locator("#run-diff")).to_be_hidden()


@pytest.mark.slow
@pytest.mark.parametrize("width", [390, 1280])
async def test_patterns_views_fit_the_width_without_sideways_scroll(patterns_server, page, width):  # noqa: F811
    """The list, one pattern's failures and the instance's comparison with a healthy run (a phone: cards)."""
    await page.set_viewport_size({"width": width, "height": 844 if width == 390 else 900})
    widths = {}
    await page.goto(patterns_server + "/#/patterns")
    row = page.locator("#patterns-table tr[data-pattern]")
    await expect(row).to_have_count(1, timeout=POLL_TIMEOUT_MS)
    widths["list"] = await page.evaluate("document.documentElement.scrollWidth")
    await row.locator("a.template").click()
    await expect(page.locator("#pattern-failures tr[data-instance]")).to_have_count(3, timeout=POLL_TIMEOUT_MS)
    widths["pattern"] = await page.evaluate("document.documentElement.scrollWidth")
    await page.goto(patterns_server + "/#/instance/C.p1")
    await expect(page.locator('#run-diff .diff-source[data-source="benchdaemon"] tr.diff-failed').first).to_be_visible(
        timeout=POLL_TIMEOUT_MS)
    widths["instance, compared with a healthy run"] = await page.evaluate("document.documentElement.scrollWidth")
    assert {view: w for view, w in widths.items() if w > width} == {}, widths
