"""The autoscaler end to end without Kubernetes: three PS-shaped local jobs (real masters on the
real etcd, stub trainers and pservers: `paddlecloud local train`), a simulated cluster of two
3-CPU nodes (a trainer asks 1 CPU), and the autoscaler's plan applied through each job's own
scale path (`scale_job`: ScaleTrainers at its master) every round.

The simulation places each job's trainers on the simulated nodes (a first-fit scheduler, in
arrival order; a shrink frees the last ones); the local jobs run their desired trainers as
processes whatever the simulation placed — the capacity is the planner's view, the resizes and
the task accounting are real. Every job must finish with each task counted exactly once.

A grow in a job's last seconds can start a trainer that is still starting when the job is
done; the local run then waits up to 60 s for it ("left to the clean-up"), so this test takes
30 s to 100 s.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import grpc
import pytest
from datasets import write_records
from etcd_history import check_job_exactly_once, mark_history
from local_runs import LocalRun, leader_of
from waiting import wait_until

from autoscaler.controller import Settings, scale_job
from autoscaler.planner import Cluster, Job, Node, plan
from paddlecloud.backends.k8s.jobs import fetch_master_status
from paddlecloud.keys import JobKeys

NODES = (("n1", 3), ("n2", 3))  # (name, CPUs): six trainer slots
SETTINGS = Settings(interval_s=0.3, max_load_desired=1.0, rpc_timeout_s=5.0, retry_wait_s=0.2)


class SimulatedCluster:
    """Where each job's trainers sit on the simulated nodes (trainer i of a job on placed[i])."""

    def __init__(self) -> None:
        self.placed: dict[str, list[str]] = {}

    def free(self) -> dict[str, int]:
        left = dict(NODES)
        for nodes in self.placed.values():
            for n in nodes:
                left[n] -= 1
        return left

    def follow(self, sizes: dict[str, int]) -> None:
        """The scheduler: shrinks free the last trainers, waiting ones bind first fit, in order."""
        for job in list(self.placed):
            if job not in sizes:
                del self.placed[job]  # finished: its share is free
        for job, size in sizes.items():
            self.placed.setdefault(job, [])
            del self.placed[job][size:]
        for job, size in sizes.items():
            while len(self.placed[job]) < size:
                room = next((n for n, left in self.free().items() if left > 0), None)
                if room is None:
                    break
                self.placed[job].append(room)

    def snapshot(self, ranges: dict[str, tuple[int, int, int]]) -> Cluster:
        free = self.free()
        nodes = tuple(Node(name=n, cpu_milli=cpu * 1000, memory_bytes=cpu, idle_cpu_milli=free[n] * 1000,
                           free_memory_bytes=free[n]) for n, cpu in NODES)
        jobs = tuple(Job(name=job, min_trainers=lo, max_trainers=hi, trainers=desired, cpu_milli=1000,
                         memory_bytes=1, nodes=tuple(self.placed.get(job, [])[:desired]))
                     for job, (lo, hi, desired) in ranges.items())
        return Cluster(nodes=nodes, jobs=jobs)


class Autoscaler:
    """The controller's round on the simulated cluster, in a thread: read each running job's
    range from its master, plan, apply every change through the job's master."""

    def __init__(self, masters: dict[str, str]) -> None:
        self.masters = masters  # job -> its leader's address; a job leaves when it ends
        self.tokens: dict[str, str] = {}  # job -> its operator token (each local run makes its own)
        self.cluster = SimulatedCluster()
        self.applied: list[tuple[str, int, int, tuple[str, ...]]] = []
        self.seen: list[dict[str, int]] = []  # trainers placed per job, after each round
        self.tasks: dict[str, int] = {}  # each job's task count, as its master told it
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def ranges(self) -> dict[str, tuple[int, int, int]]:
        out = {}
        for job, address in list(self.masters.items()):
            try:
                status = fetch_master_status(address, timeout=2, token=self.tokens.get(job))
            except grpc.RpcError:
                continue  # finished (or failing over): not planned this round
            if status.num_tasks:
                self.tasks[job] = status.num_tasks
            if status.phase in ("Succeeded", "Failed") or status.min_trainers < 1:
                continue
            out[job] = (status.min_trainers, status.max_trainers, status.desired_trainers)
        return out

    def run(self) -> None:
        while not self.stop.is_set():
            ranges = self.ranges()
            self.cluster.follow({job: desired for job, (_, _, desired) in ranges.items()})
            result = plan(self.cluster.snapshot(ranges), max_load_desired=SETTINGS.max_load_desired)
            for change in sorted(result.changes, key=lambda c: c.after - c.before):
                if scale_job(self.masters[change.job], change.after, job=change.job, settings=SETTINGS,
                             token=self.tokens.get(change.job)):
                    self.applied.append((change.job, change.before, change.after, change.reasons))
                    ranges[change.job] = (*ranges[change.job][:2], change.after)
            self.cluster.follow({job: desired for job, (_, _, desired) in ranges.items()})
            self.seen.append({job: len(nodes) for job, nodes in self.cluster.placed.items()})
            self.stop.wait(SETTINGS.interval_s)


def operator_token(run: LocalRun) -> str:
    return (run.output / ".paddlecloud" / "tokens" / "operator").read_text().strip()


def _serving(address: str, token: str) -> bool:
    try:
        return fetch_master_status(address, timeout=2, token=token).min_trainers > 0
    except grpc.RpcError:
        return False


@pytest.fixture
def jobs(tmp_path: Path, job_name: str, etcd_endpoint: str):
    runs: list[LocalRun] = []

    def start(suffix: str, *, trainers: int, lo: int, hi: int, epochs: int) -> tuple[LocalRun, str]:
        name = f"{job_name[:40]}-{suffix}"
        data = tmp_path / suffix / "data"
        write_records(data, files=4, records_per_file=100)
        run = LocalRun(tmp_path / suffix, name, "--module", "trainer_agent.stub", "--input", str(data),
                       "--trainers", str(trainers), "--min-trainers", str(lo), "--max-trainers", str(hi),
                       "--pservers", "1", "--pserver-module", "pserver_agent.stub", "--epochs", str(epochs),
                       "--chunk-bytes", "300", "--etcd-endpoints", etcd_endpoint, "--", "--delay", "0.03")
        runs.append(run)
        wait_until(lambda: asyncio.run(leader_of(etcd_endpoint, name)), timeout=60,
                   message=f"no leader for {name}")
        address = asyncio.run(leader_of(etcd_endpoint, name))
        wait_until(lambda: _serving(address, operator_token(run)), timeout=60, message=f"{name}'s master never served")
        return run, address

    yield start
    for run in runs:
        run.stop()


def test_three_local_jobs_share_a_simulated_cluster_and_each_counts_every_task_once(jobs, etcd_endpoint):
    # a and b train longer than c takes to start: c arrives while they fill the cluster
    epochs = {"a": 3, "b": 3, "c": 2}
    (tmp_a, a), (tmp_b, b) = (jobs(j, trainers=2, lo=1, hi=4, epochs=epochs[j]) for j in ("a", "b"))
    runs = {"a": tmp_a, "b": tmp_b}
    scaler = Autoscaler({"a": a, "b": b})
    scaler.tokens.update(a=operator_token(tmp_a), b=operator_token(tmp_b))
    scaler.thread.start()
    try:
        # two jobs on six slots: they grow until the cluster is full
        wait_until(lambda: scaler.seen and sum(scaler.seen[-1].values()) == 6, timeout=60,
                   message="the two jobs never filled the cluster")
        run_c, c = jobs("c", trainers=2, lo=2, hi=3, epochs=epochs["c"])
        runs["c"] = run_c
        scaler.tokens["c"] = operator_token(run_c)
        scaler.masters["c"] = c  # the newcomer, wholly pending in a full cluster
        wait_until(lambda: scaler.seen[-1].get("c", 0) >= 2 or run_c.process.poll() is not None,
                   timeout=60, message="the newcomer never placed at its min")
        for job, run in runs.items():
            assert run.wait(timeout=240) == 0, f"job {job}: {run.text()[-2000:]}"
            scaler.masters.pop(job)
    finally:
        scaler.stop.set()
        scaler.thread.join(timeout=30)

    grew = [(j, x, y) for j, x, y, why in scaler.applied if y > x]
    gave_way = [(j, x, y) for j, x, y, why in scaler.applied if any("gave way to job 'c'" in r for r in why)]
    assert ("a", 2, 3) in grew and ("b", 2, 3) in grew, scaler.applied
    assert gave_way, scaler.applied  # the newcomer made the others shrink, through their masters
    assert any(seen.get("c", 0) == 2 and sum(seen.values()) <= 6 for seen in scaler.seen)
    assert all(sum(seen.values()) <= 6 for seen in scaler.seen)
    for job, run in runs.items():
        keys = JobKeys("local", run.job)
        check_job_exactly_once(etcd_endpoint, keys, num_tasks=scaler.tasks[job], num_epochs=epochs[job])
        assert asyncio.run(mark_history(etcd_endpoint, keys, "failures")) == [], job
    text = tmp_a.text()
    assert "scaling the trainers 2 -> 3" in text
