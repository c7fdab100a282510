"""The status page with 1,000 trainers and 100,000 tasks: is it drawn in under a second?

Measured in one run on this machine, in one process: a real etcd (`EtcdServer`), a real
leading `Dispatcher` on it with a dataset of 100,000 tasks, 1,000 trainer sessions each
holding a task, the page's recorder filled with an hour of samples, and the master's
HTTP app (`master.web.StatusPage`) on this process' event loop. Figures:

* server: time to build and serialise `/api/job` and `/api/series` (median of 20), and
  their sizes;
* HTTP: a GET of each over loopback (median of 20);
* browser: Debian's chromium (headless, driven by Playwright; no browser download;
  another binary: `PADDLECLOUD_CHROMIUM`, as for the tests) opens the page; the first
  full draw after navigation (`performance.now()` when the
  first refresh is drawn: fetch, parse, DOM and SVG), then the median of the next
  refreshes, each split into fetch+draw and draw alone.

    python bench/status_page.py [--trainers 1000] [--tasks 100000]

What this does NOT measure: many browsers at once, or a page over a slow network.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (puts the checkout on sys.path)

from master import inspection
from master.config import DatasetSpec, MasterConfig, Policy
from master.dispatcher import Dispatcher
from master.web import HISTORY, StatusPage
from paddlecloud import etcd
from paddlecloud.etcd_server import EtcdServer
from paddlecloud.keys import JobKeys

REGISTER_AT_ONCE = 500
RECORD_BYTES = 10  # "FF-IIIIII\n": one record per chunk, one chunk per task
CHROMIUM = os.environ.get("PADDLECLOUD_CHROMIUM", "/usr/bin/chromium")  # as tests/browser.py
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


def write_data(directory: Path, tasks: int, files: int = 10) -> None:
    directory.mkdir(parents=True)
    per_file = tasks // files
    for f in range(files):
        (directory / f"part-{f:03d}.csv").write_text("".join(f"{f:02d}-{i:06d}\n" for i in range(per_file)))


def median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 2)


async def timed(fn, repeat: int = 20) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = await fn()
        times.append(time.perf_counter() - start)
    return median_ms(times), result


async def main(trainers: int, tasks: int) -> None:
    import aiohttp
    from playwright.async_api import async_playwright

    work = Path(tempfile.mkdtemp(prefix="bench-status-page-"))
    server = EtcdServer(str(work / "etcd")).start()
    try:
        write_data(work / "data", tasks)
        config = MasterConfig(job="bench-page", namespace="local", etcd_endpoints=server.endpoint,
                              policy=Policy(session_ttl=600, task_timeout=0),
                              dataset=DatasetSpec(paths=(str(work / "data"),), chunk_bytes=RECORD_BYTES))
        client = await etcd.connect(server.endpoint)
        session = await etcd.Session(client, ttl=60).open()
        leadership = await etcd.Election(session, JobKeys("local", "bench-page").leader).campaign("me")
        d = Dispatcher(client=client, config=config, leadership=leadership, advertise="127.0.0.1:1")
        started = time.perf_counter()
        await d.start()
        print(f"setup: dataset of {d.core.state.num_tasks} tasks adopted in "
              f"{time.perf_counter() - started:.1f}s", flush=True)
        sessions = []
        for first in range(0, trainers, REGISTER_AT_ONCE):  # etcd refuses a storm of lease grants
            sessions += await asyncio.gather(*(d.trainers.register(f"trainer-{i:05d}") for i in
                                               range(first, min(trainers, first + REGISTER_AT_ONCE))))
            await asyncio.gather(*(d.tasks.get_task(s.session, 0, []) for s in sessions[first:]))
        page = StatusPage(job="bench-page", namespace="local", advertise="127.0.0.1:1",
                          dispatcher=lambda: d, leader_hint=lambda: None)
        views = inspection.all_trainers(d)
        for _ in range(HISTORY):
            page.recorder.sample(d.core.sessions.by_trainer)
        await page.start(host="127.0.0.1", port=0)
        base = f"http://127.0.0.1:{page.port}"
        print(f"setup: {len(views)} trainers holding {sum(len(v.tasks) for v in views)} tasks; "
              f"{len(page.recorder.finished)} samples per series", flush=True)

        job_ms, job = await timed(lambda: page.job_model(operator=True))
        job_json = job.model_dump_json(exclude_none=True)
        series_ms, series = await timed(lambda: asyncio.sleep(0, page.recorder.series()))
        series_json = series.model_dump_json()
        print(f"server (this process): /api/job built+serialised {job_ms} ms, {len(job_json) / 1e3:.0f} kB; "
              f"/api/series {series_ms} ms, {len(series_json) / 1e3:.0f} kB")

        async with aiohttp.ClientSession() as http:
            async def fetch(path: str):
                async with http.get(base + path) as reply:
                    return await reply.read()
            get_job_ms, _ = await timed(lambda: fetch("/api/job"))
            get_series_ms, _ = await timed(lambda: fetch("/api/series"))
        print(f"HTTP over loopback: GET /api/job {get_job_ms} ms, GET /api/series {get_series_ms} ms")

        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            tab = await browser.new_page(viewport={"width": 1400, "height": 1000})
            await tab.goto(base + "/")
            await tab.wait_for_function("() => window.renders >= 1", timeout=60_000)
            first = await tab.evaluate("performance.now()")
            rows = await tab.evaluate("document.querySelectorAll('#trainers tr').length")
            refresh, draw = [], []
            for n in range(2, 12):
                await tab.wait_for_function(f"() => window.renders >= {n}", timeout=60_000)
                refresh.append(await tab.evaluate("window.lastRefreshMs"))
                draw.append(await tab.evaluate("window.lastDrawMs"))
            await browser.close()
        print(f"browser ({CHROMIUM}, headless): {rows} trainer rows; first draw {first:.0f} ms "
              f"after navigation; per refresh (median of {len(refresh)}): fetch+draw "
              f"{statistics.median(refresh):.0f} ms, draw {statistics.median(draw):.0f} ms")
        verdict = "under" if first < 1000 else "OVER"
        print(f"verdict: the page is drawn {verdict} 1 s ({first:.0f} ms) with {trainers} trainers "
              f"and {d.core.state.num_tasks} tasks")
        await page.stop()
        await d.stop()
        await session.close()
        await client.close()
    finally:
        server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainers", type=int, default=1000)
    parser.add_argument("--tasks", type=int, default=100_000)
    args = parser.parse_args()
    asyncio.run(main(args.trainers, args.tasks))
    sys.exit(0)
