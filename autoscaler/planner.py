"""The autoscaler's planning function: a cluster snapshot in, a size per job out, with the
reason for every change. Pure: no I/O, no clock, no Kubernetes; the same snapshot always
gives the same plan.

The rules are PaddlePaddle EDL's (`pkg/autoscaler.go`), with its defects fixed:

* Candidates are the elastic jobs (min < max) whose trainers are all placed, or every elastic
  job while some job is wholly pending (none of its trainers placed). A job without a range
  (min = max) is load: its trainers are counted and placed, its size never changes.
* Jobs are ordered by fulfillment ``(size - min) / (max - min)`` (1 when min = max),
  ascending; ties by GPU limit, then CPU request, then memory request (then name, so the
  order is total).
* A dry run repeats rounds until one changes nothing. Each round, in that order:
  1. trainers that wait (the job's size is above its placed trainers) are placed first, in
     job order, wherever they fit: growth never takes the room they are waiting for;
  2. a job placed below its min (a newcomer, wholly pending, most often) makes the elastic
     candidates above their min give way, one trainer at a time from the most fulfilled,
     until its min fits; if even all of them at their min would not make it fit, nobody
     gives way (EDL shrinks them anyway and gains nothing);
  3. every candidate, in order, grows by one when a node has the idle CPU, the free memory
     and (for a GPU job) the free GPUs of one trainer, and the cluster stays within
     `max_load_desired` of every resource the trainer requests;
  4. every candidate, in reverse order, shrinks by one when the cluster is over
     `max_load_desired` of a resource the job requests (CPU, memory or GPU) and the job is
     above its min.
  An elastic job above its max is brought down to its max first.

Defects of EDL fixed here, each pinned by a test in tests/test_autoscaler_planner.py:

* EDL's dry run *adds* a placed trainer's CPU and memory to the chosen node's idle figures
  instead of subtracting them, so one node is offered again and again: it over-commits the
  node. Here a placement takes its requests off the node it was placed on.
* EDL's scale-down looks at CPU and GPU load only (memory is ignored): a cluster over its
  memory budget never shrinks. Here memory counts like the others.
* EDL shrinks a CPU-only job because the GPUs are busy (and lets GPU jobs grow to 100% of the
  GPUs while it shrinks them above `max_load_desired`, so its dry run can swing between the
  two): here a job is shrunk only for a resource it requests, and grows only while it stays
  within `max_load_desired`, so a plan is a fixed point of its own rules.
* Load is what is placed on the nodes (other pods plus placed trainers); trainers that wait
  are demand, handled by rule 2 instead of by inflating the load as EDL does.

Parameter servers are never scaled: a job's size is its trainer count, and pserver pods are
load on their nodes like any other pod (EDL does the same).

What a plan does NOT guarantee: that Kubernetes places new trainers where the dry run did
(the dry run proves a placement exists; the scheduler picks its own), nor that the trainer a
scale-down removes is the one the dry run removed. `Job.nodes` lists a job's placed trainers
in the order its workload keeps them, so the dry run removes waiting trainers first, then the
last listed: the controller that builds the snapshot lists them so (by trainer index, for an
Indexed Job). Placement is first fit in the snapshot's node order.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

logger = logging.getLogger(__name__)

DEFAULT_MAX_LOAD_DESIRED = 0.97


def _check_count(value: object, *, what: str, minimum: int = 0) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{what} ({value!r}) must be an integer >= {minimum}.")


def _check_name(name: object, *, what: str) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"The name of {what} ({name!r}) must be a non-empty string.")


@dataclass(frozen=True)
class Node:
    """One schedulable node: what it can hold (allocatable) and what is left of it after the
    requests of the non-terminated pods bound to it (GPUs by limit), trainers included."""

    name: str
    cpu_milli: int
    memory_bytes: int
    gpu: int = 0
    idle_cpu_milli: int | None = None  # None: the whole allocatable (an empty node)
    free_memory_bytes: int | None = None
    free_gpu: int | None = None

    def __post_init__(self) -> None:
        _check_name(self.name, what="a node")
        for total, free, what in ((self.cpu_milli, "idle_cpu_milli", "CPU (millicores)"),
                                  (self.memory_bytes, "free_memory_bytes", "memory (bytes)"),
                                  (self.gpu, "free_gpu", "GPUs")):
            _check_count(total, what=f"The allocatable {what} of node {self.name!r}")
            if getattr(self, free) is None:
                object.__setattr__(self, free, total)
            left = getattr(self, free)
            _check_count(left, what=f"The {free} of node {self.name!r}")
            if left > total:
                raise ValueError(f"The {free} of node {self.name!r} ({left}) must be at most its "
                                 f"allocatable {what} ({total}).")


@dataclass(frozen=True)
class Job:
    """One training job's trainers: its range, its size, one trainer's requests, and the node
    of each placed trainer (in the order its workload keeps them; the rest wait).

    `all_running` and `wholly_pending` are EDL's two pod-phase tests, read from `nodes`.
    A fixed job has min = max; its size may differ from them (it is load: never resized).
    """

    name: str
    min_trainers: int
    max_trainers: int
    trainers: int
    cpu_milli: int
    memory_bytes: int
    gpu: int = 0
    nodes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_name(self.name, what="a job")
        _check_count(self.min_trainers, what=f"The minimum number of trainers of job {self.name!r}",
                     minimum=1)
        _check_count(self.max_trainers, what=f"The maximum number of trainers of job {self.name!r}",
                     minimum=1)
        if self.max_trainers < self.min_trainers:
            raise ValueError(f"The maximum number of trainers of job {self.name!r} "
                             f"({self.max_trainers}) must be at least its minimum ({self.min_trainers}).")
        _check_count(self.trainers, what=f"The number of trainers of job {self.name!r}")
        _check_count(self.cpu_milli, what=f"The CPU request (millicores) of job {self.name!r}")
        _check_count(self.memory_bytes, what=f"The memory request (bytes) of job {self.name!r}")
        _check_count(self.gpu, what=f"The GPU limit of job {self.name!r}")
        if not isinstance(self.nodes, tuple):
            raise ValueError(f"The nodes of job {self.name!r} ({self.nodes!r}) must be a tuple of "
                             "node names.")
        if len(self.nodes) > self.trainers:
            raise ValueError(f"Job {self.name!r} has {len(self.nodes)} placed trainers but a size of "
                             f"{self.trainers}: at most its size can be placed.")

    @property
    def elastic(self) -> bool:
        return self.min_trainers < self.max_trainers

    @property
    def all_running(self) -> bool:
        return len(self.nodes) == self.trainers

    @property
    def wholly_pending(self) -> bool:
        return self.trainers > 0 and not self.nodes


@dataclass(frozen=True)
class Cluster:
    """A snapshot: the nodes and the jobs, checked against each other (every placed trainer on
    a known node, and no node holding more trainers than its used part can hold)."""

    nodes: tuple[Node, ...]
    jobs: tuple[Job, ...]

    def __post_init__(self) -> None:
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"Node names must be unique; {twice[:3]} appear more than once.")
        jobs = [j.name for j in self.jobs]
        if len(set(jobs)) != len(jobs):
            twice = sorted({n for n in jobs if jobs.count(n) > 1})
            raise ValueError(f"Job names must be unique; {twice[:3]} appear more than once.")
        used = {n.name: [n.cpu_milli - n.idle_cpu_milli, n.memory_bytes - n.free_memory_bytes,
                         n.gpu - n.free_gpu] for n in self.nodes}
        for job in self.jobs:
            for node in job.nodes:
                if node not in used:
                    raise ValueError(f"Job {job.name!r} has a trainer on node {node!r}, which is not "
                                     "in the snapshot.")
                left = used[node]
                left[0] -= job.cpu_milli
                left[1] -= job.memory_bytes
                left[2] -= job.gpu
        for node, (cpu, memory, gpu) in used.items():
            if min(cpu, memory, gpu) < 0:
                raise ValueError(f"The trainers placed on node {node!r} request more than its used part "
                                 f"(allocatable - idle); left over: cpu {cpu}m, memory {memory} B, "
                                 f"gpu {gpu}: the snapshot is inconsistent.")


@dataclass(frozen=True)
class Change:
    """One job's size change, with the distinct reasons that led to it, in order."""

    job: str
    before: int
    after: int
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    """The outcome of a dry run: every job's size (unchanged ones included), the changes with
    their reasons, and where the dry run placed each job's trainers (the ones that still wait
    have no node)."""

    sizes: Mapping[str, int]
    changes: tuple[Change, ...]
    placements: Mapping[str, tuple[str, ...]]
    rounds: int = field(compare=False)

    def waiting(self, job: str) -> int:
        """Trainers of `job` the dry run could not place (they wait for the scheduler)."""
        return self.sizes[job] - len(self.placements[job])

    def applied_to(self, cluster: Cluster) -> Cluster:
        """`cluster` as it is once the plan is carried out as the dry run placed it: the sizes
        set, the trainers on the dry run's nodes, the nodes' idle figures following."""
        load = {n.name: [n.cpu_milli - n.idle_cpu_milli, n.memory_bytes - n.free_memory_bytes,
                         n.gpu - n.free_gpu] for n in cluster.nodes}
        for job in cluster.jobs:
            for node in job.nodes:
                load[node][0] -= job.cpu_milli
                load[node][1] -= job.memory_bytes
                load[node][2] -= job.gpu
        jobs = []
        for job in cluster.jobs:
            placed = self.placements[job.name]
            for node in placed:
                load[node][0] += job.cpu_milli
                load[node][1] += job.memory_bytes
                load[node][2] += job.gpu
            jobs.append(Job(name=job.name, min_trainers=job.min_trainers, max_trainers=job.max_trainers,
                            trainers=self.sizes[job.name], cpu_milli=job.cpu_milli,
                            memory_bytes=job.memory_bytes, gpu=job.gpu, nodes=placed))
        nodes = tuple(Node(name=n.name, cpu_milli=n.cpu_milli, memory_bytes=n.memory_bytes, gpu=n.gpu,
                           idle_cpu_milli=n.cpu_milli - load[n.name][0],
                           free_memory_bytes=n.memory_bytes - load[n.name][1],
                           free_gpu=n.gpu - load[n.name][2]) for n in cluster.nodes)
        return Cluster(nodes=nodes, jobs=tuple(jobs))


_RESOURCES = ("CPU", "memory", "GPU")


class _DryRun:
    """The mutable state of one dry run: each node's free resources, each job's size and the
    node index of each placed trainer, the cluster's committed totals, and the events."""

    def __init__(self, cluster: Cluster, max_load_desired: float) -> None:
        self.node_names = [n.name for n in cluster.nodes]
        index = {name: i for i, name in enumerate(self.node_names)}
        self.free = [[n.idle_cpu_milli for n in cluster.nodes],
                     [n.free_memory_bytes for n in cluster.nodes],
                     [n.free_gpu for n in cluster.nodes]]
        totals = (sum(n.cpu_milli for n in cluster.nodes), sum(n.memory_bytes for n in cluster.nodes),
                  sum(n.gpu for n in cluster.nodes))
        self.budget = [max_load_desired * t for t in totals]
        self.totals = totals
        self.committed = [totals[r] - sum(self.free[r]) for r in range(3)]
        self.jobs = cluster.jobs
        self.req = [(j.cpu_milli, j.memory_bytes, j.gpu) for j in cluster.jobs]
        self.size = [j.trainers for j in cluster.jobs]
        self.placed = [[index[n] for n in j.nodes] for j in cluster.jobs]
        self.events: list[tuple[int, int, str, str]] = []  # (job, delta, kind, text)

    # ---- nodes ----------------------------------------------------------------------

    def find_node(self, j: int) -> int | None:
        cpu, memory, gpu = self.req[j]
        free_cpu, free_memory, free_gpu = self.free
        for i in range(len(free_cpu)):
            if free_cpu[i] >= cpu and free_memory[i] >= memory and free_gpu[i] >= gpu:
                return i
        return None

    def take(self, j: int, i: int) -> None:
        for r, amount in enumerate(self.req[j]):
            self.free[r][i] -= amount
            self.committed[r] += amount
        self.placed[j].append(i)

    def place_waiting(self, j: int) -> bool:
        """Places one waiting trainer of job j; False when none fits."""
        i = self.find_node(j)
        if i is None:
            return False
        self.take(j, i)
        return True

    def unplace_last(self, j: int) -> None:
        i = self.placed[j].pop()
        for r, amount in enumerate(self.req[j]):
            self.free[r][i] += amount
            self.committed[r] -= amount

    def shrink(self, j: int) -> None:
        """One trainer fewer: a waiting one if any, else the last placed one."""
        if self.size[j] == len(self.placed[j]):
            self.unplace_last(j)
        self.size[j] -= 1

    # ---- jobs -----------------------------------------------------------------------

    def key(self, j: int) -> tuple:
        job = self.jobs[j]
        span = job.max_trainers - job.min_trainers
        fulfillment = (self.size[j] - job.min_trainers) / span if span else 1.0
        return (fulfillment, job.gpu, job.cpu_milli, job.memory_bytes, job.name)

    def order(self) -> list[int]:
        return sorted(range(len(self.jobs)), key=self.key)

    def waiting(self, j: int) -> int:
        return self.size[j] - len(self.placed[j])

    def candidates(self, order: list[int]) -> list[int]:
        some_pending = any(self.size[j] > 0 and not self.placed[j] for j in range(len(self.jobs)))
        return [j for j in order if self.jobs[j].elastic and (some_pending or not self.waiting(j))]

    def over_load(self, j: int) -> str | None:
        """The first resource job j requests of which the cluster is over its budget."""
        for r, amount in enumerate(self.req[j]):
            if amount and self.committed[r] > self.budget[r]:
                return (f"cluster {_RESOURCES[r]} load {self.committed[r] / self.totals[r]:.1%} > "
                        f"max_load_desired {self.budget[r] / self.totals[r]:.0%}")
        return None

    def within_load_after_one_more(self, j: int) -> bool:
        return all(not amount or self.committed[r] + amount <= self.budget[r]
                   for r, amount in enumerate(self.req[j]))

    def note(self, j: int, delta: int, kind: str, text: str) -> None:
        self.events.append((j, delta, kind, text))

    # ---- the rules --------------------------------------------------------------------

    def clamp_to_max(self) -> None:
        for j, job in enumerate(self.jobs):
            while job.elastic and self.size[j] > job.max_trainers:
                self.shrink(j)
                self.note(j, -1, "above-max", f"above its max ({job.max_trainers})")

    def place_all_waiting(self, order: list[int]) -> bool:
        changed = False
        for j in order:
            while self.waiting(j) and self.place_waiting(j):
                changed = True
        return changed

    def give_way(self, s: int) -> bool:
        """Rule 2 for job s: donors give one trainer at a time, most fulfilled first, until the
        min of s fits; all undone when it never does."""
        need = self.jobs[s].min_trainers - len(self.placed[s])
        saved = ([list(f) for f in self.free], list(self.committed), list(self.size),
                 [list(p) for p in self.placed], len(self.events))
        while True:
            placed = 0
            while placed < need and self.place_waiting(s):
                placed += 1
            if placed == need:
                return True
            for _ in range(placed):
                self.unplace_last(s)
            donors = [d for d in self.candidates(range(len(self.jobs)))
                      if d != s and self.size[d] > self.jobs[d].min_trainers]
            if not donors:
                self.free, self.committed, self.size, self.placed = saved[:4]
                del self.events[saved[4]:]
                return False
            d = max(donors, key=self.key)
            self.shrink(d)
            self.note(d, -1, "gave-way", f"gave way to job {self.jobs[s].name!r}, placed below its "
                      f"min ({self.jobs[s].min_trainers})")

    def round(self) -> bool:
        changed = self.place_all_waiting(self.order())
        for s in self.order():
            if len(self.placed[s]) < self.jobs[s].min_trainers <= self.size[s] and self.give_way(s):
                changed = True
        cands = self.candidates(self.order())
        for j in cands:
            if (self.size[j] < self.jobs[j].max_trainers and self.within_load_after_one_more(j)
                    and self.grow(j)):
                changed = True
        for j in reversed(cands):
            if self.size[j] > self.jobs[j].min_trainers and (why := self.over_load(j)):
                self.shrink(j)
                self.note(j, -1, "over-load", why)
                changed = True
        return changed

    def grow(self, j: int) -> bool:
        """Rule 3: one more trainer for job j, placed at once; False when none fits."""
        i = self.find_node(j)
        if i is None:
            return False
        self.take(j, i)
        self.size[j] += 1
        self.note(j, +1, "grew", "room on the nodes and under max_load_desired")
        return True


def plan(cluster: Cluster, *, max_load_desired: float = DEFAULT_MAX_LOAD_DESIRED) -> Plan:
    """The dry run of the module docstring on `cluster`: every job's new size, the reasons for
    each change, and where the dry run placed each job's trainers."""
    if not isinstance(cluster, Cluster):
        raise TypeError(f"plan() takes a Cluster, not {type(cluster).__name__}.")
    if not (isinstance(max_load_desired, int | float) and 0 < max_load_desired <= 1):
        raise ValueError(f"max_load_desired ({max_load_desired!r}) must be a number in (0, 1].")
    run = _DryRun(cluster, max_load_desired)
    run.clamp_to_max()
    rounds = 1
    while run.round():
        rounds += 1
    changes = []
    for j, job in enumerate(cluster.jobs):
        if run.size[j] != job.trainers:
            reasons: dict[str, str] = {}
            for k, _delta, kind, text in run.events:
                if k == j:
                    reasons.setdefault(kind, text)
            changes.append(Change(job=job.name, before=job.trainers, after=run.size[j],
                                  reasons=tuple(reasons.values())))
    logger.debug("planned %d jobs on %d nodes in %d rounds: %d changes", len(cluster.jobs),
                 len(cluster.nodes), rounds, len(changes))
    return Plan(sizes=MappingProxyType({j.name: run.size[k] for k, j in enumerate(cluster.jobs)}),
                changes=tuple(changes),
                placements=MappingProxyType({j.name: tuple(run.node_names[i] for i in run.placed[k])
                                             for k, j in enumerate(cluster.jobs)}),
                rounds=rounds)
