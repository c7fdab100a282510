"""The autoscaler's two benchmarks, measured in one run on this machine:

1. Planning time: `autoscaler.plan` on a seeded synthetic cluster of 1,000 nodes and 200 jobs
   (running, partly placed and wholly pending ones; 1 node in 5 with GPUs), repeated; the
   issue's target is under 100 ms.
2. A simulated day: jobs arrive from a seeded generator (arrival times, work in
   trainer-seconds, ranges, requests) on a simulated cluster, run three ways:
   * autoscaler on: each job is submitted at its min; every simulated minute the planner's
     plan is carried out as its dry run placed it (the simulation trusts the dry run's
     placement as the scheduler's);
   * autoscaler off, every job at a fixed size, started when all of it fits (first come,
     first served, with backfill: as without EDL): at its max, and at its min.
   Figures: cluster utilisation (CPU requested by running trainers / allocatable, over the
   day) and the mean job waiting time (arrival to start), the two figures EDL exists to
   improve, plus mean completion time and the number of resizes.

What the simulation does NOT model: the cost of a resize (free here: a PS-mode job's trainers
join and leave; a collective job pays a group restart per resize), speed-up that is not
linear in the trainer count, GPUs, and pods other than the jobs' trainers.

    python bench/autoscale.py                 # full run; --write-docs updates docs/benchmarks.md
    python bench/autoscale.py --quick         # tiny sizes (a smoke test, not a verdict)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python bench/autoscale.py` from a checkout
    sys.path.insert(0, str(ROOT))

from autoscaler import Cluster, Job, Node, plan  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from common import pyplot  # noqa: E402

GIB = 2**30
TARGET_MS = 100.0
SECTION = "autoscaler"


def machine() -> str:
    return (f"{platform.node() or '?'}: {platform.platform()}, Python {platform.python_version()}, "
            f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()})")


# ---- 1. planning time --------------------------------------------------------------------


def synthetic_cluster(*, nodes: int, jobs: int, seed: int) -> Cluster:
    """`nodes` nodes (32 cores, 128 GiB; 1 in 5 with 8 GPUs) with other pods on them, and `jobs`
    jobs with ranges up to 40 wide: 9 in 10 submitted and placed where they fit (first fit
    from a random node; the rest of a job waits), 1 in 10 wholly pending."""
    rng = random.Random(seed)
    shapes, free = [], []
    for i in range(nodes):
        gpu = 8 if i % 5 == 0 else 0
        other = (rng.randrange(0, 16000, 500), rng.randrange(0, 48) * GIB, rng.randint(0, gpu))
        shapes.append((f"node-{i:04d}", 32000, 128 * GIB, gpu))
        free.append([32000 - other[0], 128 * GIB - other[1], gpu - other[2]])
    built = []
    for k in range(jobs):
        lo = rng.randint(1, 8)
        hi = lo + rng.randint(0, 40)
        req = (rng.randrange(500, 8001, 500), rng.randint(1, 16) * GIB, rng.choice([0, 0, 0, 1, 2]))
        pending = k % 10 == 0
        size = lo if pending else rng.randint(lo, hi)
        placed: list[str] = []
        start = rng.randrange(nodes)
        while not pending and len(placed) < size:
            spot = next((i % nodes for i in range(start, start + nodes)
                         if all(free[i % nodes][r] >= req[r] for r in range(3))), None)
            if spot is None:
                break
            for r in range(3):
                free[spot][r] -= req[r]
            placed.append(shapes[spot][0])
        built.append(Job(name=f"job-{k:03d}", min_trainers=lo, max_trainers=hi, trainers=size, cpu_milli=req[0],
                         memory_bytes=req[1], gpu=req[2], nodes=tuple(placed)))
    return Cluster(nodes=tuple(Node(name=n, cpu_milli=c, memory_bytes=m, gpu=g, idle_cpu_milli=f[0],
                                    free_memory_bytes=f[1], free_gpu=f[2])
                               for (n, c, m, g), f in zip(shapes, free, strict=True)),
                   jobs=tuple(built))


def planning_time(*, nodes: int, jobs: int, repeats: int, seed: int) -> dict:
    cluster = synthetic_cluster(nodes=nodes, jobs=jobs, seed=seed)
    load_before = os.getloadavg()[0]
    times, cpu = [], []
    for _ in range(repeats):
        started, cpu_started = time.perf_counter(), time.process_time()
        result = plan(cluster)
        times.append((time.perf_counter() - started) * 1e3)
        cpu.append((time.process_time() - cpu_started) * 1e3)
    return {"nodes": nodes, "jobs": jobs, "repeats": repeats, "ms": times, "cpu_ms": cpu,
            "median_ms": statistics.median(times), "min_ms": min(times),
            "median_cpu_ms": statistics.median(cpu), "load_before": load_before, "rounds": result.rounds,
            "changes": len(result.changes),
            "running": sum(len(j.nodes) == j.trainers for j in cluster.jobs),
            "wholly_pending": sum(j.trainers > 0 and not j.nodes for j in cluster.jobs),
            "waiting_after": sum(result.waiting(j.name) for j in cluster.jobs)}


# ---- 2. a simulated day ------------------------------------------------------------------


@dataclass
class SimJob:
    name: str
    arrival: float
    work: float  # trainer-seconds
    lo: int
    hi: int
    cpu: int
    mem: int
    done: float = 0.0
    started: float | None = None
    finished: float | None = None
    size: int = 0
    nodes: tuple[str, ...] = ()
    resizes: int = field(default=0)


def arrivals(*, seed: int, day_s: float, mean_gap_s: float) -> list[SimJob]:
    """Poisson arrivals over `day_s`; work log-normal around 6 trainer-hours; 1 job in 5 fixed
    (min = max); ranges 1-4 up to +12; 1-8 cores and 2-16 GiB per trainer."""
    rng = random.Random(seed)
    jobs, t = [], 0.0
    while True:
        t += rng.expovariate(1 / mean_gap_s)
        if t >= day_s:
            return jobs
        lo = rng.randint(1, 4)
        hi = lo if rng.random() < 0.2 else lo + rng.randint(2, 12)
        jobs.append(SimJob(name=f"j{len(jobs):03d}", arrival=t, work=rng.lognormvariate(math.log(6 * 3600), 0.8),
                           lo=lo, hi=hi, cpu=rng.randint(1, 8) * 1000, mem=rng.randint(2, 16) * GIB))


def simulate(jobs: list[SimJob], *, nodes: int, mode: str, step_s: float, day_s: float) -> dict:
    """Runs `jobs` (copies) until all finish; mode 'on' (the planner), 'max' or 'min' (fixed)."""
    jobs = [SimJob(**{k: v for k, v in vars(j).items()}) for j in jobs]
    names = [f"n{i:02d}" for i in range(nodes)]
    cap = (32000, 128 * GIB)
    free = {n: list(cap) for n in names}
    queue: list[SimJob] = []
    arriving = sorted(jobs, key=lambda j: j.arrival)
    busy_day, samples, planning = [], [], []
    t = 0.0
    while arriving or queue or any(j.finished is None and j.size for j in jobs):
        while arriving and arriving[0].arrival <= t:
            job = arriving.pop(0)
            queue.append(job)
            if mode == "on":
                job.size = job.lo
        live = [j for j in jobs if j.arrival <= t and j.finished is None]
        if mode == "on":
            snapshot = Cluster(
                nodes=tuple(Node(name=n, cpu_milli=cap[0], memory_bytes=cap[1], idle_cpu_milli=free[n][0],
                                 free_memory_bytes=free[n][1]) for n in names),
                jobs=tuple(Job(name=j.name, min_trainers=j.lo, max_trainers=j.hi, trainers=j.size,
                               cpu_milli=j.cpu, memory_bytes=j.mem, nodes=j.nodes) for j in live))
            started = time.perf_counter()
            result = plan(snapshot)
            planning.append(time.perf_counter() - started)
            for change in result.changes:
                next(j for j in live if j.name == change.job).resizes += 1
            after = result.applied_to(snapshot)
            free = {n.name: [n.idle_cpu_milli, n.free_memory_bytes] for n in after.nodes}
            for j in live:
                j.size, j.nodes = result.sizes[j.name], result.placements[j.name]
        else:
            for j in list(queue):  # first come first served, with backfill: whoever fits starts
                size = j.hi if mode == "max" else j.lo
                spots = _first_fit(free, names, j, size)
                if spots is not None:
                    for n in spots:
                        free[n][0] -= j.cpu
                        free[n][1] -= j.mem
                    j.size, j.nodes = size, tuple(spots)
        for j in live:
            running = len(j.nodes) >= j.lo
            if running and j.started is None:
                j.started = t
                queue.remove(j)
            if running:
                j.done += len(j.nodes) * step_s
                if j.done >= j.work:
                    j.finished = t + step_s
                    for n in j.nodes:
                        free[n][0] += j.cpu
                        free[n][1] += j.mem
                    j.size, j.nodes = 0, ()
        used = sum(cap[0] - f[0] for f in free.values()) / (cap[0] * nodes)
        if t < day_s:
            busy_day.append(used)
        samples.append((t, used))
        t += step_s
    waits = [j.started - j.arrival for j in jobs]
    turnaround = [j.finished - j.arrival for j in jobs]
    return {"mode": mode, "utilisation": statistics.fmean(busy_day), "mean_wait_s": statistics.fmean(waits),
            "p90_wait_s": sorted(waits)[int(0.9 * (len(waits) - 1))],
            "mean_completion_s": statistics.fmean(turnaround), "makespan_s": t,
            "resizes": sum(j.resizes for j in jobs), "jobs": len(jobs),
            "plan_ms_median": statistics.median(planning) * 1e3 if planning else None,
            "hourly": [statistics.fmean(u for s, u in samples if h * 3600 <= s < (h + 1) * 3600)
                       for h in range(int(math.ceil(t / 3600)))
                       if any(h * 3600 <= s < (h + 1) * 3600 for s, _ in samples)]}


def _first_fit(free: dict[str, list[int]], names: list[str], job: SimJob, size: int) -> list[str] | None:
    """Nodes for all `size` trainers of `job` (first fit in node order), or None: all or nothing."""
    left = {n: list(free[n]) for n in names}
    spots = []
    for _ in range(size):
        spot = next((n for n in names if left[n][0] >= job.cpu and left[n][1] >= job.mem), None)
        if spot is None:
            return None
        left[spot][0] -= job.cpu
        left[spot][1] -= job.mem
        spots.append(spot)
    return spots


# ---- report ------------------------------------------------------------------------------


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h"


def report(results: dict, say) -> None:
    say(f"machine: {results['machine']}")
    p = results["planning"]
    say(f"Planning time: {p['nodes']:,} nodes, {p['jobs']} jobs ({p['running']} all running, "
        f"{p['wholly_pending']} wholly pending), {p['repeats']} runs")
    say(f"  wall: median {p['median_ms']:.1f} ms, min {p['min_ms']:.1f} ms (runs "
        f"{', '.join(f'{x:.0f}' for x in p['ms'])}); CPU: median {p['median_cpu_ms']:.1f} ms; load average "
        f"before: {p['load_before']:.2f}")
    say(f"  {p['rounds']} rounds, {p['changes']} jobs resized, {p['waiting_after']} trainers left waiting")
    s = results["simulation"]
    say(f"Simulated day: {s['jobs']} jobs arriving over {s['day_s'] / 3600:.0f} h (seed {s['seed']}, mean gap "
        f"{s['mean_gap_s'] / 60:.0f} min) on {s['nodes']} nodes of 32 cores and 128 GiB, one plan per "
        f"simulated {s['step_s']:.0f} s")
    say(f"  offered load: the day's arrivals need {s['offered']:.0%} of the cluster's CPU over the arrival window, at one "
        "trainer-second per second of work")
    say(f"  {'':28} {'utilisation':>11} {'mean wait':>10} {'p90 wait':>9} {'mean completion':>16} "
        f"{'all done':>9} {'resizes':>8}")
    for row in s["runs"]:
        label = {"on": "autoscaler on (min..max)", "max": "off: fixed at max",
                 "min": "off: fixed at min"}[row["mode"]]
        say(f"  {label:28} {row['utilisation']:>11.1%} {hours(row['mean_wait_s']):>10} "
            f"{hours(row['p90_wait_s']):>9} {hours(row['mean_completion_s']):>16} "
            f"{hours(row['makespan_s']):>9} {row['resizes']:>8}")
    on = next(r for r in s["runs"] if r["mode"] == "on")
    for row in s["runs"]:
        if row["mode"] != "on":
            say(f"  on vs off ({row['mode']}): utilisation {on['utilisation'] / row['utilisation']:.2f}x, "
                f"mean wait {_ratio(on['mean_wait_s'], row['mean_wait_s'])}, "
                f"mean completion {_ratio(on['mean_completion_s'], row['mean_completion_s'])}")
    say(f"  planning time per simulated minute (autoscaler on): median {on['plan_ms_median']:.2f} ms")
    say("Goals")
    for what, ms, why in (("CPU", p["median_cpu_ms"], ""),
                          ("wall", p["median_ms"], f" (load average {p['load_before']:.2f} on {os.cpu_count()} "
                                                   "CPUs: other work's share of the cores counts here)")):
        say(f"  {'met   ' if ms < TARGET_MS else 'MISSED'}  planning time for {p['nodes']:,} nodes and "
            f"{p['jobs']} jobs < {TARGET_MS:.0f} ms, {what}: median {ms:.1f} ms" + why)


def _ratio(on: float, off: float) -> str:
    return f"{on / off:.2f}x" if off else "n/a"


def plot(results: dict, path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False

    s = results["simulation"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = {"on": "autoscaler on", "max": "off: fixed at max", "min": "off: fixed at min"}
    for row in s["runs"]:
        left.plot(range(len(row["hourly"])), row["hourly"], label=labels[row["mode"]])
    left.axvline(s["day_s"] / 3600, color="grey", linestyle=":", linewidth=1, label="arrivals stop")
    left.set_xlabel("simulated hour")
    left.set_ylabel("CPU requested by running trainers / allocatable")
    left.set_ylim(0, 1.05)
    left.set_title("Cluster utilisation (hourly mean)")
    left.legend(fontsize=8)
    modes = [r["mode"] for r in s["runs"]]
    x = range(len(modes))
    right.bar([i - 0.2 for i in x], [r["mean_wait_s"] / 3600 for r in s["runs"]], width=0.4, label="mean wait")
    right.bar([i + 0.2 for i in x], [r["mean_completion_s"] / 3600 for r in s["runs"]], width=0.4,
              label="mean completion")
    right.set_xticks(list(x), [labels[m] for m in modes])
    right.set_ylabel("hours after arrival")
    right.set_title(f"{s['jobs']} jobs arriving over {s['day_s'] / 3600:.0f} simulated hours, {s['nodes']} nodes")
    right.legend(fontsize=8)
    fig.suptitle(f"bench/autoscale.py on {results['machine']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def write_docs(md: Path, lines: list[str], png: str) -> None:
    """Replaces the part between this benchmark's markers in `md` (report.py's convention)."""
    body = "\n".join([f"![autoscaler on and off over a simulated day]({png})", "", "```", *lines, "```"]) + "\n"
    text = md.read_text()
    pattern = re.compile(rf"(<!-- generated:{SECTION} -->\n).*?(<!-- /generated:{SECTION} -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"{md} has no <!-- generated:{SECTION} --> ... <!-- /generated:{SECTION} --> markers")
    md.write_text(pattern.sub(lambda m: m.group(1) + body + m.group(2), text, count=1))


def run(args: argparse.Namespace) -> int:
    lines: list[str] = []

    def say(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    quick = args.quick
    nodes, jobs = (args.nodes or (50 if quick else 1000)), (args.jobs or (10 if quick else 200))
    results: dict = {"machine": machine(), "quick": quick,
                     "planning": planning_time(nodes=nodes, jobs=jobs, repeats=args.repeats or (2 if quick else 9),
                                               seed=args.seed)}
    day_s = (3 if quick else 24) * 3600.0
    sim_nodes = args.sim_nodes or (4 if quick else 16)
    mean_gap_s = args.mean_gap or (20 if quick else 4) * 60.0
    arrived = arrivals(seed=args.seed, day_s=day_s, mean_gap_s=mean_gap_s)
    runs = [simulate(arrived, nodes=sim_nodes, mode=mode, step_s=60.0, day_s=day_s) for mode in ("on", "max", "min")]
    offered = sum(j.work * j.cpu for j in arrived) / (sim_nodes * 32000 * day_s)
    results["simulation"] = {"offered": offered, "seed": args.seed, "day_s": day_s, "mean_gap_s": mean_gap_s, "nodes": sim_nodes,
                             "step_s": 60.0, "jobs": len(arrived), "runs": runs}
    report(results, say)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    png = Path(args.png) if args.png else ROOT / "docs" / "autoscaler.png"
    if args.write_docs or args.png:
        plot(results, png)
    if args.write_docs:
        write_docs(Path(args.write_docs), lines, png.name)
        print(f"wrote {args.write_docs} (part {SECTION}) and {png}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/autoscale.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test, not a verdict")
    parser.add_argument("--nodes", type=int, help="nodes of the planning-time cluster [1000; --quick 50]")
    parser.add_argument("--jobs", type=int, help="jobs of the planning-time cluster [200; --quick 10]")
    parser.add_argument("--repeats", type=int, help="planning runs timed [9; --quick 2]")
    parser.add_argument("--sim-nodes", type=int, help="nodes of the simulated cluster [16; --quick 4]")
    parser.add_argument("--mean-gap", type=float, help="mean seconds between arrivals [240; --quick 1200]")
    parser.add_argument("--seed", type=int, default=1, help="seed of both generators [1]")
    parser.add_argument("--json", metavar="PATH", help="also write every figure as JSON")
    parser.add_argument("--png", metavar="PATH", help="draw the plot there [docs/autoscaler.png with --write-docs]")
    parser.add_argument("--write-docs", metavar="MD", nargs="?", const=str(ROOT / "docs" / "benchmarks.md"),
                        help="replace this benchmark's generated part of MD [docs/benchmarks.md]")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
