"""The status page with 1,000 trainers and 100,000 tasks: is it drawn in under a second?

Measured in one run on this machine: a real etcd (`EtcdServer`), a real `paddlecloud master`
process (the one users run) with a dataset of 100,000 tasks, 1,000 trainer sessions each
holding a task (registered over gRPC by this process), and the page's recorder sampling once
a second for `--history` seconds before the measurements. Figures:

* HTTP: a GET of `/api/job`, `/api/series` and `/api/goodput` over loopback (median of 20:
  the master builds, serialises and sends each), and their sizes;
* browser: Debian's chromium (headless, driven by Playwright; no browser download;
  another binary: `PADDLECLOUD_CHROMIUM`, as for the tests) opens the page; the first
  full draw after navigation (`performance.now()` when the
  first refresh is drawn: fetch, parse, DOM and SVG), then the median of the next
  refreshes, each split into fetch+draw and draw alone.

    python bench/status_page.py [--trainers 1000] [--tasks 100000] [--history 60]

What this does NOT measure: many browsers at once, a page over a slow network, or a full hour
of samples (the series hold `--history` seconds of them: pass 3600 for the page's worst case).
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
from common import Master  # noqa: E402

from paddlecloud.api import pb, pb_grpc
from paddlecloud.etcd_server import EtcdServer, free_port

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


async def hold_tasks(address: str, trainers: int) -> int:
    """Registers `trainers` sessions, each taking a task; how many hold one."""
    import grpc

    held = 0
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.MasterStub(channel)

        async def one(i: int) -> int:
            session = (await stub.RegisterTrainer(pb.RegisterTrainerRequest(
                trainer_id=f"trainer-{i:05d}"), timeout=120)).session_id
            reply = await stub.GetTask(pb.GetTaskRequest(session_id=session, epoch=0), timeout=120)
            return int(reply.outcome == pb.TASK)
        for first in range(0, trainers, REGISTER_AT_ONCE):  # etcd refuses a storm of lease grants
            held += sum(await asyncio.gather(*(one(i) for i in range(first, min(trainers, first + REGISTER_AT_ONCE)))))
    return held


async def main(trainers: int, tasks: int, history: float) -> None:
    import aiohttp
    from playwright.async_api import async_playwright

    work = Path(tempfile.mkdtemp(prefix="bench-status-page-"))
    server = EtcdServer(str(work / "etcd")).start()
    page_port = free_port()
    master = Master(job="bench-page", etcd=server.endpoint, log_dir=work, args=[
        "--input", str(work / "data"), "--chunk-bytes", str(RECORD_BYTES), "--session-ttl", "600s",
        "--task-timeout", "0", "--metrics-port", str(page_port),
        "--register-rate", "100000", "--register-burst", "100000"])
    try:
        write_data(work / "data", tasks)
        master.start()
        started = time.perf_counter()
        await asyncio.to_thread(master.wait_serving, 300)
        print(f"setup: a master process SERVING with {tasks:,} tasks in "
              f"{time.perf_counter() - started:.1f}s", flush=True)
        held = await hold_tasks(master.address, trainers)
        print(f"setup: {trainers} trainers holding {held} tasks; sampling {history:g} s of series",
              flush=True)
        await asyncio.sleep(history)  # the page's recorder samples once a second
        base = f"http://127.0.0.1:{page_port}"

        async with aiohttp.ClientSession() as http:
            async def fetch(path: str):
                async with http.get(base + path) as reply:
                    return await reply.read()
            get_job_ms, job = await timed(lambda: fetch("/api/job"))
            get_series_ms, series = await timed(lambda: fetch("/api/series"))
            get_goodput_ms, goodput = await timed(lambda: fetch("/api/goodput"))
        print(f"HTTP over loopback (the master builds, serialises and sends): GET /api/job "
              f"{get_job_ms} ms ({len(job) / 1e3:.0f} kB), /api/series {get_series_ms} ms "
              f"({len(series) / 1e3:.0f} kB), /api/goodput {get_goodput_ms} ms ({len(goodput) / 1e3:.0f} kB)")

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
        print(f"verdict: the page is drawn {verdict} 1 s ({first:.0f} ms) with {trainers} trainers, "
              f"{tasks:,} tasks and {history:g} s of series")
    finally:
        if master.alive():
            master.stop()
        server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainers", type=int, default=1000)
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--history", type=float, default=60,
                        help="seconds the master samples its series before the measurements [60]")
    args = parser.parse_args()
    asyncio.run(main(args.trainers, args.tasks, args.history))
    sys.exit(0)
