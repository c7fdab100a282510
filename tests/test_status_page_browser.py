"""The status page in a real headless browser, on a local job with stub trainers, and on an
in-process leader with more trainers than the page lists."""

from __future__ import annotations

import os
import re
import signal
import urllib.request
from pathlib import Path

import pytest
from browser import chromium_page, chromium_tab, require_browser
from datasets import write_records
from local_runs import LocalRun
from masters import wait_for, wait_until
from processes import find

from master.web import StatusPage

STUB = "trainer_agent.stub"
# The docs' screenshot is rewritten only when asked (a plain test run leaves the tree clean):
# PADDLECLOUD_WRITE_DOCS=1 pytest tests/test_status_page_browser.py
DOCS_SCREENSHOT = Path(__file__).resolve().parents[1] / "docs" / "status-page.png"
PAGE_WAIT_MS = 90_000  # generous: the page follows a job that a loaded box runs slowly


@pytest.fixture
def run_job(local_run):
    return local_run


def page_url(run: LocalRun) -> str:
    """The URL the CLI printed, once the master listens there (it prints it as it starts it)."""
    url = wait_until(lambda: re.search(r"status page of master 0: (http://\S+)", run.text()),
                     timeout=60, message="no status page URL printed", details=run.text).group(1)

    def answers() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                return reply.status == 200
        except OSError:
            return False

    wait_until(answers, timeout=60, message=f"nothing answers at {url}", details=run.text)
    return url


def number(page, testid: str) -> float:
    return float(page.get_by_test_id(testid).inner_text())


@pytest.mark.timeout(240)
def test_the_page_follows_a_local_job_to_its_end(tmp_path, run_job, job_name):
    require_browser()
    write_records(tmp_path / "data", files=6, records_per_file=60)
    run = run_job("--module", STUB, "--input", str(tmp_path / "data"), "--trainers", "2",
                  "--epochs", "2", "--chunk-bytes", "300", "--restart", "trainer",
                  "--session-ttl", "2s", "--", "--delay", "0.04")
    url = page_url(run)
    with chromium_page() as page:
        page.goto(url)
        page.get_by_test_id("phase").filter(has_text="Running").wait_for(timeout=PAGE_WAIT_MS)
        page.wait_for_function("() => Number(document.getElementById('finished').textContent) > 0",
                               timeout=PAGE_WAIT_MS)
        first = number(page, "finished")
        page.wait_for_function(f"() => Number(document.getElementById('finished').textContent) > {first}",
                               timeout=PAGE_WAIT_MS)
        # A trainer frozen past its session's TTL: its tasks come back, cause expiry...
        victim = wait_until(lambda: find(job_name, module=STUB, PADDLE_TRAINER_ID="1"), timeout=30)[0]
        os.kill(victim, signal.SIGSTOP)
        try:
            page.get_by_test_id("requeue-causes").filter(has_text="expiry").wait_for(timeout=PAGE_WAIT_MS)
        finally:
            os.kill(victim, signal.SIGKILL)  # ... then killed: the local job restarts it
        page.wait_for_function("() => Number(document.getElementById('restarts').textContent) >= 1",
                               timeout=PAGE_WAIT_MS)
        assert page.locator("#trainers tr[data-trainer='1'] td").last.inner_text() == "1"
        # The epoch advances on the page (epochs count from 0).
        page.wait_for_function("() => document.getElementById('epoch').textContent === '1'",
                               timeout=PAGE_WAIT_MS)
        assert page.locator("#epochs .epoch[data-stage='past']").count() >= 1
        assert page.locator("#plot-requeues polyline[data-series='expiry']").count() == 1
        assert page.locator("#plot-restarts polyline[data-series='resizes']").count() == 1
        assert page.locator("#masters tr[data-role='leader']").count() == 1  # the job's one master
        # goodput: the summary line and the stacked plot, productive trainers in it
        page.get_by_test_id("goodput-summary").filter(has_text="% productive").wait_for(
            timeout=PAGE_WAIT_MS)
        page.wait_for_selector("#plot-goodput polygon[data-series='productive']", timeout=PAGE_WAIT_MS)
        screenshot = DOCS_SCREENSHOT if os.environ.get("PADDLECLOUD_WRITE_DOCS") else tmp_path / "page.png"
        page.screenshot(path=str(screenshot), full_page=True)
        assert screenshot.stat().st_size > 10_000  # a page, not an empty frame
        # The job's end shows on the page, with no reload.
        renders = page.evaluate("window.renders")
        page.get_by_test_id("phase").filter(has_text="Succeeded").wait_for(timeout=PAGE_WAIT_MS)
        assert page.evaluate("window.renders") > renders
        assert page.evaluate("performance.getEntriesByType('navigation').length") == 1
    assert run.wait(timeout=120) == 0, run.text()


@pytest.mark.timeout(180)
def test_a_failed_job_shows_why_at_the_top_and_its_tasks_reasons_escaped(tmp_path, run_job):
    require_browser()
    data = tmp_path / "data"
    data.mkdir()
    for f in range(2):  # every record poisoned, with markup in it: each task fails every attempt
        (data / f"part-{f}.csv").write_text(
            "".join(f"<img src=x onerror=injected=1><b>{f}{i}</b>POISON\n" for i in range(3)))
    run = run_job("--module", STUB, "--input", str(data), "--restart", "trainer")
    url = page_url(run)
    with chromium_page() as page:
        page.goto(url)
        page.get_by_test_id("phase").filter(has_text="Failed").wait_for(timeout=PAGE_WAIT_MS)
        banner = page.locator("#failure")
        assert banner.is_visible() and "every task of epoch 0 failed" in banner.inner_text()
        reasons = page.locator("#failed-tasks td.reasons").first.inner_text()
        assert "poisoned record" in reasons and "<img src=x onerror=injected=1><b>" in reasons  # as text
        assert page.locator("#failed-tasks b, #failed-tasks img").count() == 0
        assert page.evaluate("window.injected === undefined")
    assert run.wait(timeout=120) == 1, run.text()


@pytest.mark.timeout(120)
async def test_past_its_limit_the_page_lists_the_stalest_trainers_and_says_how_many_it_left_out(
        leader, job_name):
    require_browser()
    status = StatusPage(job=job_name, namespace="local", advertise="me:1", dispatcher=lambda: leader,
                        leader_hint=lambda: None, trainers_shown=2)
    await status.start(host="127.0.0.1", port=0)
    try:
        sessions = [(await leader.trainers.register(f"t{i}")).session for i in range(5)]
        await wait_for(lambda: len(status.recorder.sessions) == 5, timeout=10)
        await leader.trainers.register("t4")  # a restart of a trainer the page does not list
        async with chromium_tab() as tab:
            await tab.goto(f"http://127.0.0.1:{status.port}/")
            await tab.get_by_test_id("trainers-omitted").filter(has_text="3 more trainers alive").wait_for(
                timeout=PAGE_WAIT_MS)
            rows = tab.locator("#trainers tr")
            assert [await rows.nth(i).get_attribute("data-trainer") for i in range(await rows.count())] == [
                "t0", "t1"]
            await tab.wait_for_function("() => document.getElementById('restarts').textContent === '1'",
                                        timeout=PAGE_WAIT_MS)
            for session in sessions[:4]:  # all but t4 call: t4's new session is the stalest now
                await leader.trainers.keep_alive(session)
            await tab.locator("#trainers tr[data-trainer='t4']").wait_for(timeout=PAGE_WAIT_MS)
            await leader.trainers.leave(sessions[0])
            await leader.trainers.leave(sessions[1])
            await leader.trainers.leave(sessions[2])  # two left, both listed: the note goes
            await tab.wait_for_function("() => document.getElementById('trainers-omitted').hidden",
                                        timeout=PAGE_WAIT_MS)
            assert await tab.locator("#trainers tr").count() == 2
    finally:
        await status.stop()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("width", [900, 1400])
async def test_plot_labels_are_readable_and_the_trainers_tasks_are_headed_as_ids(leader, job_name, tmp_path, width):
    """The plots' labels were drawn in a 400-unit viewBox scaled to the figure (~6 px on a
    laptop's screen); "tasks held" headed a list of task ids as if it were a count."""
    require_browser()
    status = StatusPage(job=job_name, namespace="local", advertise="me:1", dispatcher=lambda: leader,
                        leader_hint=lambda: None)
    await status.start(host="127.0.0.1", port=0)
    try:
        await leader.trainers.register("t0")
        async with chromium_tab(width=width) as tab:
            await tab.goto(f"http://127.0.0.1:{status.port}/")
            await tab.locator("#plot-alive text").first.wait_for(timeout=PAGE_WAIT_MS)
            await tab.locator("#trainers tr[data-trainer='t0']").wait_for(timeout=PAGE_WAIT_MS)
            sizes = await tab.evaluate("""() => [...document.querySelectorAll('.plots svg text')].map(
                (t) => ({plot: t.ownerSVGElement.id, height: t.getBoundingClientRect().height,
                         font: parseFloat(getComputedStyle(t).fontSize), text: t.textContent}))""")
            assert {s["plot"] for s in sizes} >= {"plot-finished", "plot-requeues", "plot-alive", "plot-restarts"}
            # drawn at the CSS size (12 px), not scaled down with the figure
            small = [s for s in sizes if s["height"] < 11]
            assert not small, small
            headers = await tab.locator("#trainers").locator("xpath=..").locator("th").all_inner_texts()
            assert "task ids held" in headers and "tasks held" not in headers
            await tab.screenshot(path=str(tmp_path / f"page-{width}.png"), full_page=True)
    finally:
        await status.stop()
