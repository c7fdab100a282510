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
  2. a job with fewer than its min placed but a size of at least its min (a newcomer,
     wholly pending, most often; fixed jobs too) makes the elastic candidates above their
     min give way, one trainer at a time from the most fulfilled, each of its trainers
     going where a donor's trainer left, until its min is placed; if even all of them at
     their min would not make room, nobody gives way (EDL shrinks them anyway and gains
     nothing). A job whose size is below its min only grows, by rule 3;
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
Indexed Job). Placement is first fit in the snapshot's node order (rule 2's: where the
donors' trainers left).
"""

from __future__ import annotations

import logging
from bisect import insort
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


MI = 1024**2


def _mi(nbytes: int) -> str:
    return f"{nbytes // MI}Mi"


def describe(cluster: Cluster) -> str:
    """What one inquiry saw, in one line (EDL's `Cluster.InquiryResource done` log, read by
    people): the node count; CPU, memory and GPU totals and what is left of them; each node's
    idle/total; each job's demand (size, range, one trainer's requests, placed trainers)."""
    nodes = cluster.nodes
    cpu, idle = sum(n.cpu_milli for n in nodes), sum(n.idle_cpu_milli or 0 for n in nodes)
    memory, free = sum(n.memory_bytes for n in nodes), sum(n.free_memory_bytes or 0 for n in nodes)
    gpu, free_gpu = sum(n.gpu for n in nodes), sum(n.free_gpu or 0 for n in nodes)
    per_node = ", ".join(
        f"{n.name} cpu {n.idle_cpu_milli}m/{n.cpu_milli}m mem {_mi(n.free_memory_bytes or 0)}/"
        f"{_mi(n.memory_bytes)} gpu {n.free_gpu}/{n.gpu}" for n in nodes) or "none"
    jobs = ", ".join(
        f"{j.name} {j.trainers} trainers ({len(j.nodes)} placed, range {j.min_trainers}..{j.max_trainers}, "
        f"each cpu {j.cpu_milli}m mem {_mi(j.memory_bytes)} gpu {j.gpu})" for j in cluster.jobs) or "none"
    return (f"{len(nodes)} node(s): cpu idle {idle}m of {cpu}m, memory free {_mi(free)} of {_mi(memory)}, "
            f"gpu free {free_gpu} of {gpu}; idle/total per node: {per_node}; "
            f"{len(cluster.jobs)} job(s): {jobs}")


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
    node index of each placed trainer, the cluster's committed totals, and the events.

    Two indexes keep a round cheap on large clusters (docs/benchmarks.md, "Autoscaler"):
    * first fit by request shape: `hints[shape] = (start, seen, maybe)` says no node below
      `start` fits that shape, except perhaps the nodes in `maybe` and those freed since
      `frees[seen]` (free resources only grow where a trainer leaves), so a search resumes
      where the last one stopped, and a job that did not fit looks again only at the nodes
      freed since;
    * give-way: a job that could not reach its min even with every donor at its min is not
      tried again while that cannot have changed (see `give_way`).
    """

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
        self.lo = [j.min_trainers for j in cluster.jobs]
        self.hi = [j.max_trainers for j in cluster.jobs]
        self.elastic = [j.elastic for j in cluster.jobs]
        self.size = [j.trainers for j in cluster.jobs]
        self.placed = [[index[n] for n in j.nodes] for j in cluster.jobs]
        self.keys = [self._key(j) for j in range(len(self.jobs))]
        self.events: list[tuple[int, int, str, str]] = []  # (job, delta, kind, text)
        self.hints: dict[tuple[int, int, int], tuple[int, int, tuple[int, ...]]] = {}
        self.frees: list[int] = []   # node indexes, each time a node's free resources grew
        self.shrunk: list[int] = []  # job indexes, each time a job lost a trainer
        self.no_way: dict[int, tuple[int, frozenset[int], int]] = {}  # see give_way

    # ---- nodes ----------------------------------------------------------------------

    def find_node(self, j: int) -> int | None:
        """The first node (in snapshot order) with room for one trainer of job j."""
        shape = self.req[j]
        cpu, memory, gpu = shape
        free_cpu, free_memory, free_gpu = self.free
        start, seen, maybe = self.hints.get(shape, (0, 0, ()))
        if seen < len(self.frees):
            maybe = tuple(sorted({*maybe, *(i for i in self.frees[seen:] if i < start)}))
        for at, i in enumerate(maybe):
            if free_cpu[i] >= cpu and free_memory[i] >= memory and free_gpu[i] >= gpu:
                self.hints[shape] = (start, len(self.frees), maybe[at:])
                return i
        for i in range(start, len(free_cpu)):
            if free_cpu[i] >= cpu and free_memory[i] >= memory and free_gpu[i] >= gpu:
                self.hints[shape] = (i, len(self.frees), ())
                return i
        self.hints[shape] = (len(free_cpu), len(self.frees), ())
        return None

    def fits(self, j: int, i: int) -> bool:
        return all(self.free[r][i] >= amount for r, amount in enumerate(self.req[j]))

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

    def shrink(self, j: int) -> int | None:
        """One trainer fewer: a waiting one if any (returns None), else the last placed one
        (returns the node it freed)."""
        i = None
        if self.size[j] == len(self.placed[j]):
            i = self.placed[j].pop()
            for r, amount in enumerate(self.req[j]):
                self.free[r][i] += amount
                self.committed[r] -= amount
            self.frees.append(i)
        self.size[j] -= 1
        self.keys[j] = self._key(j)
        self.shrunk.append(j)
        return i

    # ---- jobs -----------------------------------------------------------------------

    def _key(self, j: int) -> tuple:
        job = self.jobs[j]
        span = job.max_trainers - job.min_trainers
        fulfillment = (self.size[j] - job.min_trainers) / span if span else 1.0
        return (fulfillment, job.gpu, job.cpu_milli, job.memory_bytes, job.name)

    def order(self) -> list[int]:
        return sorted(range(len(self.jobs)), key=self.keys.__getitem__)

    def waiting(self, j: int) -> int:
        return self.size[j] - len(self.placed[j])

    def some_pending(self) -> bool:
        """Whether some job is wholly pending (none of its trainers placed)."""
        size, placed = self.size, self.placed
        return any(size[j] and not placed[j] for j in range(len(size)))

    def candidates(self, order: list[int]) -> list[int]:
        size, placed, elastic = self.size, self.placed, self.elastic
        if self.some_pending():
            return [j for j in order if elastic[j]]
        return [j for j in order if elastic[j] and size[j] == len(placed[j])]

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

    def give_way(self, order: list[int]) -> bool:
        """Rule 2, for each job s placed below its min (in job order): the donors (elastic
        candidates above their min) give one trainer at a time, most fulfilled first, each of
        s's trainers going where a trainer left, until s's min is placed. Nobody gives way
        when even every donor at its min would not make room for it.

        That test is skipped when it failed before with as many of s's trainers placed, no
        donor now that was not a donor then, and nobody shrunk since who was not a donor then:
        free resources plus the donors' excess can only have shrunk since, and s's identical
        trainers fit per node independently, so it would fail again."""
        changed = False
        donors: list[int] | None = None  # with `excess`, kept while the candidates are the same
        excess: dict[int, list[int]] | None = None
        pending = self.some_pending()
        for s in order:
            if not len(self.placed[s]) < self.lo[s] <= self.size[s]:
                continue
            while len(self.placed[s]) < self.lo[s] and self.place_waiting(s):
                changed = True
            if pending != self.some_pending():  # s is placed now: the candidates are fewer
                pending, donors, excess = not pending, None, None
            need = self.lo[s] - len(self.placed[s])
            if need <= 0:
                continue
            if donors is None:
                donors = [d for d in self.candidates(self.order()) if self.size[d] > self.lo[d]]
            givers = [d for d in donors if d != s]
            now = frozenset(givers)
            tried = self.no_way.get(s)
            if (tried and tried[0] == len(self.placed[s]) and now <= tried[1]
                    and tried[1].issuperset(self.shrunk[tried[2]:])):
                continue
            if excess is None:
                excess = self.excess(donors)
            # No node fits s now: only nodes a donor's trainer would leave can take it (s has
            # no excess of its own, being below its min).
            if self.room_for(s, excess, need) < need:
                self.no_way[s] = (len(self.placed[s]), now, len(self.shrunk))
                continue
            givers.sort(key=self.keys.__getitem__)
            while need:
                d = givers.pop()
                i = self.shrink(d)
                self.note(d, -1, "gave-way", f"gave way to job {self.jobs[s].name!r}, placed below "
                          f"its min ({self.lo[s]})")
                if self.size[d] > self.lo[d]:
                    insort(givers, d, key=self.keys.__getitem__)
                if i is not None:
                    held = excess[i]  # the trainer that left was above d's min
                    for r, amount in enumerate(self.req[d]):
                        held[r] -= amount
                while i is not None and need and self.fits(s, i):
                    self.take(s, i)
                    need -= 1
            changed = True
            donors = [d for d in donors if self.size[d] > self.lo[d]]
            if pending != self.some_pending():
                pending, donors, excess = not pending, None, None
        return changed

    def excess(self, donors: list[int]) -> dict[int, list[int]]:
        """Per node, what the donors' trainers above their min hold there."""
        held: dict[int, list[int]] = {}
        for d in donors:
            cpu, memory, gpu = self.req[d]
            for i in self.placed[d][self.lo[d]:]:
                room = held.get(i)
                if room is None:
                    held[i] = [cpu, memory, gpu]
                else:
                    room[0] += cpu
                    room[1] += memory
                    room[2] += gpu
        return held

    def room_for(self, s: int, excess: dict[int, list[int]], need: int) -> int:
        """How many trainers of s (up to `need`, or a little more) the nodes in `excess` would
        take with that excess freed."""
        wanted = [(r, amount) for r, amount in enumerate(self.req[s]) if amount]
        if not wanted:
            return need if excess else 0
        free, room = self.free, 0
        for i, more in excess.items():
            room += min((free[r][i] + more[r]) // amount for r, amount in wanted)
            if room >= need:
                break
        return room

    def round(self) -> bool:
        order = self.order()
        changed = self.place_all_waiting(order)
        if self.give_way(order):
            changed = True
            order = self.order()
        cands = self.candidates(order)
        committed, budget = self.committed, self.budget
        for j in cands:
            if self.size[j] < self.hi[j] and self.within_load_after_one_more(j) and self.grow(j):
                changed = True
        for j in reversed(cands):
            if not (committed[0] > budget[0] or committed[1] > budget[1] or committed[2] > budget[2]):
                break  # shrinking only lowers the load: nobody after j is over it either
            if self.size[j] > self.lo[j] and (why := self.over_load(j)):
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
        self.keys[j] = self._key(j)
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
    reasons: dict[int, dict[str, str]] = {}
    for j, _delta, kind, text in run.events:
        reasons.setdefault(j, {}).setdefault(kind, text)
    changes = []
    for j, job in enumerate(cluster.jobs):
        if run.size[j] != job.trainers:
            changes.append(Change(job=job.name, before=job.trainers, after=run.size[j],
                                  reasons=tuple(reasons[j].values())))
    logger.debug("planned %d jobs on %d nodes in %d rounds: %d changes", len(cluster.jobs),
                 len(cluster.nodes), rounds, len(changes))
    return Plan(sizes=MappingProxyType({j.name: run.size[k] for k, j in enumerate(cluster.jobs)}),
                changes=tuple(changes),
                placements=MappingProxyType({j.name: tuple(run.node_names[i] for i in run.placed[k])
                                             for k, j in enumerate(cluster.jobs)}),
                rounds=rounds)
