"""The page's machines view shows a degraded machine: its recent rate beside its best, and why
(Debian's Chromium against a real server, with the fixtures of tests/test_page.py)."""

from __future__ import annotations

import datetime as dt

import pytest
from playwright.async_api import expect

from tests.fleet import bench_instance, post, utcnow
from tests.test_page import fleet, page  # noqa: F401 (fixtures)


@pytest.mark.slow
async def test_machines_view_shows_recent_rate_and_why_a_machine_is_degraded(fleet, page):  # noqa: F811
    # machine 777 proved 40 an hour ago (the fixture); rented again, it proves 20
    await bench_instance(fleet.http, "C.20", 777, done=utcnow() - dt.timedelta(minutes=1), exit_code=0, rate=20.0, dph=0.8)
    await post(fleet.http, "/api/v1/policy/run", {})
    why = "recent rate 30.0 proofs/hour (mean of the last 2 runs: 20.0, 40.0) < 0.8 x best 40.0 = 32.0"
    await page.goto(fleet.url + "/#/machines")
    row = page.locator('tr[data-machine="777"]')
    await expect(row.locator('[data-degraded="true"]')).to_have_text("30.0")
    await expect(row.locator("td.why")).to_have_text(why)
    await expect(row).to_contain_text("degraded")
    await expect(row.locator("[data-eligible]")).to_have_text("eligible")  # degrade_action flag: still eligible
    await expect(page.locator('tr[data-machine="55891"] [data-degraded]')).to_have_count(0)  # no rate: no recent rate

    await page.click('tr[data-machine="777"] a')
    summary = page.locator("#machine-summary")
    await expect(summary).to_contain_text("degraded machine")
    await expect(summary.locator('[data-fact="best rate"]')).to_contain_text("40.0")
    await expect(summary.locator('[data-fact="recent rate"]')).to_have_text("30.0")
    await expect(summary.locator('[data-fact="degraded"]')).to_have_text(why)
    await expect(page.locator("#machine-decisions")).to_contain_text("flag_degraded")
