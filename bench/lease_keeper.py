"""Lease refreshes under a busy event loop: the keeper on the loop against the master's, in a
process of its own (paddlecloud.lease_process), side by side in one run.

    python bench/lease_keeper.py            # N=2,000 leases, 0/16/64 spinning coroutines
    python bench/lease_keeper.py --quick    # a smoke run (< 30 s)

What runs: etcd as paddlecloud starts it (a real disk, fsync on), N leases granted on it, and
B coroutines on this process's event loop (uvloop, as the master's) that each spin the CPU
for 0.7 ms and yield: a master's loop busy with thousands of trainers' calls turns that
slowly. Then each keeper refreshes the N leases, every refresh waited for, and the bench
prints refreshes per second, or that the keeper did not finish within --limit seconds.
Why it matters: at 10,000 trainers a session's lease needs a refresh every TTL at least
(333 a second at the default 30 s TTL).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_lines, refuse_tmpfs, start_etcd, table  # noqa: E402

SPIN = 0.0007  # seconds each busy coroutine holds the loop per turn


async def _spin(stop: asyncio.Event) -> None:
    while not stop.is_set():
        until = time.perf_counter() + SPIN
        while time.perf_counter() < until:
            pass
        await asyncio.sleep(0)


async def refresh_rate(endpoint: str, *, kind: str, leases: int, busy: int, limit: float) -> float | None:
    """Refreshes per second of one keeper with `busy` coroutines spinning; None: not done in `limit`."""
    from paddlecloud import etcd
    from paddlecloud.lease_process import LeaseKeeperProcess

    client = await etcd.connect(endpoint)
    keeper = etcd.LeaseKeeper(client) if kind == "loop" else LeaseKeeperProcess(endpoint)
    ids = [(await client.lease(120)).id for _ in range(leases)]
    stop = asyncio.Event()
    try:
        await keeper.refresh(ids[0])  # the stream (and the process) up before the clock starts
        spinners = [asyncio.ensure_future(_spin(stop)) for _ in range(busy)]
        await asyncio.sleep(0.2)
        start = time.perf_counter()
        try:
            await asyncio.wait_for(asyncio.gather(*(keeper.refresh(i, timeout=limit) for i in ids)), limit)
            return leases / (time.perf_counter() - start)
        except (asyncio.TimeoutError, etcd.EtcdUnavailable):
            return None
        finally:
            stop.set()
            await asyncio.gather(*spinners)
    finally:
        await keeper.close()
        for lease in ids:
            await client.revoke_lease(lease)
        await client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (< 30 s)")
    parser.add_argument("--leases", type=int, help="leases refreshed per measurement [2000; --quick 200]")
    parser.add_argument("--busy", help="spinning coroutines, comma-separated [0,16,64; --quick 0,16]")
    parser.add_argument("--limit", type=float, help="seconds a keeper has for all N [60; --quick 10]")
    parser.add_argument("--dir", default="/var/tmp", help="where etcd's data goes (not tmpfs)")
    args = parser.parse_args()
    leases = args.leases or (200 if args.quick else 2000)
    busy = [int(b) for b in (args.busy or ("0,16" if args.quick else "0,16,64")).split(",")]
    limit = args.limit or (10.0 if args.quick else 60.0)
    refuse_tmpfs(args.dir, False)
    work = Path(tempfile.mkdtemp(prefix="paddlecloud-keeper-", dir=args.dir))
    etcd_server = start_etcd(work / "etcd")
    from paddlecloud import aio
    try:
        print("paddlecloud lease-keeper benchmark")
        print("\n".join(machine_lines(str(work / "etcd"))))
        print(f"{leases} leases, each refresh waited for; busy coroutines spin {SPIN * 1000:g} ms per turn; "
              f"uvloop; limit {limit:g} s")
        rows = []
        for b in busy:  # both keepers at each load, one after the other
            rates = {kind: aio.run(refresh_rate(etcd_server.endpoint, kind=kind, leases=leases, busy=b,
                                                limit=limit)) for kind in ("loop", "process")}
            cells = [f"{r:,.0f}" if r else f"not done in {limit:g} s" for r in rates.values()]
            ratio = (f"{rates['process'] / rates['loop']:.1f}x" if rates["loop"] and rates["process"]
                     else "-")
            rows.append([str(b), *cells, ratio])
        print("\n".join(table(["busy coroutines", "on the loop (refreshes/s)", "own process (refreshes/s)",
                               "process / loop"], rows)))
    finally:
        etcd_server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
