"""The dashboard (``GET /``, docs/dashboard.md) in headless Chromium against a live replica.

Two jobs move bytes flat out through real client sessions; the page must show both in
its table and as two coloured areas of its chart, and switch the policy through its
own form (wrong token → 403 shown, bad parameter → 422 shown, then the switch), which
the API must then report. Needs Debian's ``chromium`` and ``chromium-driver``
(deploy/system-deps.sh installs them). ``BURSTCTL_SCREENSHOT=1`` also refreshes
``docs/dashboard.png``.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service as ChromeService
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select
from support import Pump, wait_until
from test_windows import probe_replica  # noqa: F401  (fixture)

from burstctl.client import JobInfo, Session
from burstctl.controller.app import Replica

pytestmark = pytest.mark.integration

MiB = 1 << 20
DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "dashboard.png"
JOBS = {
    "4711": JobInfo("4711", "ann", "bio", nodes=2),
    "4712": JobInfo("4712", "bob", "chem", nodes=3),
}
TARGET = "size-fair"  # any registered policy other than the default fair-share

# The machine is offline: nothing of Chromium may try to reach the network.
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,1000",
)


@pytest.fixture(autouse=True)
def _no_token_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BURSTCTL_ADMIN_TOKEN", raising=False)


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} not found: install chromium and chromium-driver (deploy/system-deps.sh)"
        )
    return path


@contextmanager
def chromium(profile: Path) -> Iterator[webdriver.Chrome]:
    """Headless Chromium through chromedriver, both from Debian; quit on exit."""
    options = webdriver.ChromeOptions()
    options.binary_location = _binary("chromium")
    for arg in (*CHROMIUM_ARGS, f"--user-data-dir={profile}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # An explicit driver path: Selenium Manager (which downloads drivers) is never run.
    driver_service = ChromeService(
        executable_path=_binary("chromedriver"), log_output=str(profile.parent / "chromedriver.log")
    )
    driver = webdriver.Chrome(options=options, service=driver_service)
    try:
        yield driver
    finally:
        driver.quit()


def js(driver: WebDriver, script: str, *args: object) -> Any:
    return driver.execute_script(script, *args)


def table_rows(driver: WebDriver) -> dict[str, list[str]]:
    """job id → the cells of its row, as shown."""
    rows = js(
        driver,
        "return [...document.querySelectorAll('#jobs-table tbody tr')]"
        ".map(r => [...r.cells].map(c => c.textContent.trim()))",
    )
    return {cells[0]: cells for cells in rows}


def legend_labels(driver: WebDriver) -> list[str]:
    return js(
        driver,
        "return [...document.querySelectorAll('#chart .u-legend .u-series .u-label')]"
        ".map(e => e.textContent.trim())",
    )


# Pixels of the chart's canvas in each series' colour (its stroke, or its translucent fill).
COUNT_PIXELS = """
const colors = arguments[0];
const canvas = document.querySelector('#chart canvas');
const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
const rgb = colors.map(h => [1, 3, 5].map(i => parseInt(h.slice(i, i + 2), 16)));
const counts = colors.map(() => 0);
for (let i = 0; i < data.length; i += 4) {
  if (data[i + 3] < 40) continue;
  rgb.forEach((c, k) => {
    const d = Math.abs(data[i] - c[0]) + Math.abs(data[i + 1] - c[1])
      + Math.abs(data[i + 2] - c[2]);
    if (d < 30) counts[k] += 1;
  });
}
return counts;
"""


def chart_shows_jobs(driver: WebDriver) -> dict[str, dict[str, Any]] | None:
    """Each job's series, once both have moved bytes in the last interval and are drawn."""
    series = {s["job_id"]: s for s in js(driver, "return window.dashboard.series()")}
    if set(series) != set(JOBS) or set(legend_labels(driver)) < set(JOBS):
        return None
    if not all(s["last"] and s["last"] > 0.5 * MiB for s in series.values()):
        return None
    pixels = js(driver, COUNT_PIXELS, [series[j]["color"] for j in JOBS])
    if min(pixels) < 500:  # an area of at least a few hundred pixels each
        return None
    return series


def visible_text(driver: WebDriver, element_id: str) -> str | None:
    element = driver.find_element(By.ID, element_id)
    return element.text if element.is_displayed() else None


def submit_token(driver: WebDriver, token: str) -> None:
    wait_until(lambda: driver.find_element(By.ID, "token-form").is_displayed(), 5, 0.02, "token")
    field = driver.find_element(By.ID, "token-input")
    field.clear()
    field.send_keys(token)
    driver.find_element(By.ID, "token-submit").click()


def drive(url: str, token: str, out: Path) -> None:
    """The whole browser session (blocking: runs in a thread, off the controller's loop)."""
    with chromium(out / "profile") as driver:
        driver.get(url + "/")

        def table_shows_jobs() -> bool:
            rows = table_rows(driver)
            # cells: job, user, group, nodes, state, ...
            return set(rows) == set(JOBS) and all(
                rows[j][1:4] == [i.user, i.group, str(i.nodes)]
                and rows[j][4] in ("active", "in I/O")
                for j, i in JOBS.items()
            )

        wait_until(table_shows_jobs, 15, 0.05, "the job table to show both jobs")
        series = wait_until(lambda: chart_shows_jobs(driver), 15, 0.05, "both jobs in the chart")
        assert isinstance(series, dict)
        # the stacked areas are the jobs' own throughput: bounded by the capacity (40 MiB/s)
        assert all(s["max"] < 60 * MiB for s in series.values())
        assert js(driver, "return window.dashboard.policy().name") == "fair-share"
        # no job has a periodic pattern under fair-share: the panel stays hidden
        assert not driver.find_element(By.ID, "patterns-panel").is_displayed()

        # Switch: the page asks for the token first; a wrong one and a bad parameter
        # are both shown, and the policy stays until the right request succeeds.
        Select(driver.find_element(By.ID, "policy-select")).select_by_value(TARGET)
        params = driver.find_element(By.ID, "policy-params-input")
        params.send_keys('{"bogus": 1}')
        assert not driver.find_element(By.ID, "token-form").is_displayed()  # viewing needs none
        driver.find_element(By.ID, "policy-apply").click()
        submit_token(driver, "not-the-token")
        error = wait_until(lambda: visible_text(driver, "policy-error"), 5, 0.02, "403 shown")
        assert "403" in str(error) and "wrong bearer token" in str(error)
        submit_token(driver, token)
        wait_until(
            lambda: "422" in (visible_text(driver, "policy-error") or ""), 5, 0.02, "422 shown"
        )
        assert "params.bogus" in driver.find_element(By.ID, "policy-error").text
        assert driver.find_element(By.ID, "policy-name").text == "fair-share"
        params.clear()
        driver.find_element(By.ID, "policy-apply").click()  # the token is kept for the tab
        wait_until(
            lambda: driver.find_element(By.ID, "policy-name").text == TARGET,
            5,
            0.02,
            "the page to show the new policy",
        )
        assert TARGET in str(visible_text(driver, "policy-ok"))
        assert not driver.find_element(By.ID, "policy-error").is_displayed()

        if os.environ.get("BURSTCTL_SCREENSHOT") == "1":
            # a longer history and the table refreshed, for the picture in docs/
            wait_until(lambda: js(driver, "return window.dashboard.samples()") >= 30, 60, 0.1)
        driver.save_screenshot(str(out / "dashboard.png"))

        # JavaScript errors fail the test; the 403 and 422 answers above are "network" entries.
        errors = [
            e
            for e in driver.get_log("browser")
            if e["level"] == "SEVERE" and e["source"] != "network"
        ]
        assert not errors, errors


async def test_dashboard_shows_jobs_live_and_switches_the_policy(
    replica: Replica, tmp_path: Path
) -> None:
    token = (replica.config.state_dir / "admin-token").read_text().strip()
    sessions = ExitStack()
    pumps: list[Pump] = []
    try:
        for info in JOBS.values():
            s = await asyncio.to_thread(Session, replica.grpc_address, info)
            sessions.callback(s.close)
            pumps.append(Pump(s).start())
        await asyncio.to_thread(drive, replica.http_url, token, tmp_path)
        async with httpx.AsyncClient(base_url=replica.http_url) as http:
            policy = (await http.get("/v1/policy")).json()
        assert (policy["name"], policy["params"], policy["version"]) == (TARGET, {}, 1)
        assert replica.slot.name == TARGET
    finally:
        await asyncio.to_thread(lambda: [p.stop() for p in pumps])
        await asyncio.to_thread(sessions.close)
    assert not any(p.errors for p in pumps)
    if os.environ.get("BURSTCTL_SCREENSHOT") == "1":
        shutil.copyfile(tmp_path / "dashboard.png", DOCS_SCREENSHOT)


def drive_patterns(url: str, out: Path) -> None:
    """The page draws each job's windows over one period (blocking: runs in a thread)."""
    with chromium(out / "profile") as driver:
        driver.get(url + "/")
        wait_until(
            lambda: (
                js(driver, "return window.dashboard.schedules()")
                == [{"job_id": "periodic", "windows": 1}]
            ),
            15,
            0.05,
            "the pattern of the periodic job",
        )
        assert driver.find_element(By.ID, "patterns-panel").is_displayed()
        label = driver.find_element(By.CSS_SELECTOR, "#patterns .pattern-label").text
        assert label.startswith("periodic") and "1.00 s" in label
        # one window of 0.3 s in a 1 s period: 30 % of the bar's width, in the job's colour
        bars = js(
            driver,
            "return [...document.querySelectorAll('#patterns svg rect[fill]')]"
            ".map(r => Number(r.getAttribute('width')))",
        )
        assert bars == [pytest.approx(0.3 * 600)]
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors


async def test_dashboard_draws_the_periodic_patterns(
    probe_replica: Callable[..., Awaitable[Replica]],  # noqa: F811
    tmp_path: Path,
) -> None:
    replica = await probe_replica(job="periodic")
    session = await asyncio.to_thread(
        Session, replica.grpc_address, JobInfo("periodic", "ann", "phys")
    )
    pump = Pump(session).start()
    try:
        await asyncio.to_thread(drive_patterns, replica.http_url, tmp_path)
    finally:
        await asyncio.to_thread(pump.stop)
        await asyncio.to_thread(session.close)
    assert not pump.errors


def drive_buffer(url: str, out: Path) -> None:
    """The page shows the burst buffer: its fill, a job's resident/pending/drain rate and
    its drain error (blocking: runs in a thread)."""
    with chromium(out / "profile") as driver:
        driver.get(url + "/")

        def shown() -> dict[str, Any] | None:
            cap = js(driver, "return window.dashboard.capacity()")
            if not cap or not cap["jobs"]:
                return None
            row = cap["jobs"][0]
            ok = row["resident"] == 3 * MiB and row["drain_rate"] > 0 and row["drain_error"]
            return cap if ok else None

        cap = wait_until(shown, 15, 0.05, "the burst buffer panel with the job's bytes")
        assert isinstance(cap, dict)
        assert driver.find_element(By.ID, "buffer-panel").is_displayed()
        cells = [td.text for td in driver.find_elements(By.CSS_SELECTOR, "#buffer-table tbody td")]
        assert cells[:3] == ["ckpt", "3.00", "2.00"], cells
        assert cells[5] == "PFS unwritable: EACCES"
        assert float(cells[3]) == pytest.approx(4.0, rel=0.05)  # --pfs-bandwidth 4MiB/s
        # the fill bar: used of S, as wide as the share
        width = js(driver, "return document.getElementById('buffer-used').style.width")
        assert float(width.rstrip("%")) == pytest.approx(100 * cap["used"] / cap["size"], abs=0.1)
        assert "of 8.00 MiB used" in driver.find_element(By.ID, "buffer-summary").text
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors


async def test_dashboard_shows_the_burst_buffer(
    replica_factory: Callable[..., Awaitable[Replica]], tmp_path: Path
) -> None:
    replica = await replica_factory(bb_capacity=8 * MiB, pfs_bandwidth=4 * MiB)
    info = JobInfo("ckpt", "ann", "phys")
    mount = await asyncio.to_thread(Session, replica.grpc_address, info, buffer=True)
    drain = await asyncio.to_thread(Session, replica.grpc_address, info, purpose="drain")
    pump = Pump(drain).start()
    try:
        await asyncio.to_thread(mount.acquire_space, 3 * MiB)
        mount.report_buffer(3 * MiB, 2 * MiB, "PFS unwritable: EACCES")
        await asyncio.to_thread(drive_buffer, replica.http_url, tmp_path)
    finally:
        await asyncio.to_thread(pump.stop)
        await asyncio.to_thread(drain.close)
        await asyncio.to_thread(mount.close)
    assert not pump.errors


async def test_page_and_vendored_library_are_served_from_the_package(
    replica_factory: Callable[..., Awaitable[Replica]],
) -> None:
    svc = await replica_factory(protect_reads=True)
    async with httpx.AsyncClient(base_url=svc.http_url) as http:
        page = await http.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        # no CDN: every script and stylesheet the page loads comes from /static/
        refs = re.findall(r'(?:src|href)="([^"]+)"', page.text)
        assert refs and all(r.startswith("/static/") or r == "data:," for r in refs), refs
        for ref in refs:
            if ref.startswith("/static/"):
                assert (await http.get(ref)).status_code == 200, ref
        assert (await http.get("/static/vendor/uplot-1.6.32/LICENSE")).status_code == 200
        assert (await http.get("/static/../rest.py")).status_code == 404
        # the page holds no data: open even when reads need the token, unlike the API
        assert (await http.get("/v1/jobs")).status_code == 401


def drive_rules(url: str, out: Path) -> None:
    """The page shows the rules and, per job, the rule that binds it (blocking: a thread)."""
    with chromium(out / "profile") as driver:
        driver.get(url + "/")

        def shown() -> dict[str, list[str]] | None:
            rows = table_rows(driver)
            ok = (
                "L" in rows and rows["L"][-1] == "slow (limited)" and rows.get("X", [""])[-1] == "–"
            )
            return rows if ok else None

        rows = wait_until(shown, 15, 0.05, "job L bound to rule slow, limited")
        assert isinstance(rows, dict)
        assert float(rows["L"][-2]) >= 0.0  # seconds waited on its bucket
        assert driver.find_element(By.ID, "rules-panel").is_displayed()
        cells = [td.text for td in driver.find_elements(By.CSS_SELECTOR, "#rules-table tbody td")]
        assert cells[:3] == ["slow", "job=L", "2.00"], cells
        assert cells[6] == "1" and cells[-1] == "limit binds", cells
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors


async def test_dashboard_shows_the_rules_and_the_rule_of_each_job(
    replica_factory: Callable[..., Awaitable[Replica]], tmp_path: Path
) -> None:
    replica = await replica_factory()
    token = (replica.config.state_dir / "admin-token").read_text().strip()
    async with httpx.AsyncClient(
        base_url=replica.http_url, headers={"Authorization": f"Bearer {token}"}
    ) as http:
        rule = {"name": "slow", "match": {"job": "L"}, "limit": 2 * MiB}
        assert (await http.post("/v1/rules", json=rule)).status_code == 201
    with ExitStack() as stack:
        pumps = []
        for job_id in ("L", "X"):
            s = await asyncio.to_thread(Session, replica.grpc_address, JobInfo(job_id, "ann", "g"))
            stack.callback(s.close)
            pumps.append(Pump(s).start())
        try:
            await asyncio.to_thread(drive_rules, replica.http_url, tmp_path)
        finally:
            await asyncio.to_thread(lambda: [p.stop() for p in pumps])
    assert not any(p.errors for p in pumps)
