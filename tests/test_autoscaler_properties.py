"""Properties of the autoscaler's planner on random small clusters (hypothesis): sizes stay in
range, no node is ever committed past what it has, a job placed below its min is never left
so while elastic jobs above their min could make room for it, and a plan is a fixed point of
its own rules (planning again on the cluster with the plan applied changes nothing)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler import Cluster, Job, Node, Plan, plan

pytestmark = pytest.mark.unit

GIB = 2**30
EXAMPLES = settings(max_examples=150, deadline=None)  # the box is shared: keep it light


@st.composite
def clusters(draw) -> tuple[Cluster, float]:
    """1-5 nodes with other pods on them, 0-5 jobs (elastic and fixed, CPU and GPU) whose
    trainers are placed where they fit, some waiting, some jobs wholly pending."""
    count = draw(st.integers(1, 5))
    free: list[list[int]] = []
    shapes = []
    for i in range(count):
        cpu = draw(st.integers(0, 16)) * 500
        gib = draw(st.integers(0, 32))
        gpu = draw(st.sampled_from([0, 0, 1, 2, 4]))
        other = (draw(st.integers(0, cpu // 500)) * 500, draw(st.integers(0, gib)), draw(st.integers(0, gpu)))
        shapes.append((f"n{i}", cpu, gib * GIB, gpu))
        free.append([cpu - other[0], (gib - other[1]) * GIB, gpu - other[2]])
    jobs = []
    for k in range(draw(st.integers(0, 5))):
        lo = draw(st.integers(1, 3))
        hi = lo + draw(st.sampled_from([0, 0, 1, 2, 4, 6]))
        size = draw(st.integers(0, hi + 2))
        req = (draw(st.integers(0, 6)) * 500, draw(st.integers(0, 8)) * GIB, draw(st.sampled_from([0, 0, 0, 1, 2])))
        wanted = draw(st.lists(st.integers(0, count - 1), max_size=size))
        placed = []
        for i in wanted:  # place where it fits, stop at the first that does not: the rest wait
            if any(free[i][r] < req[r] for r in range(3)):
                break
            for r in range(3):
                free[i][r] -= req[r]
            placed.append(f"n{i}")
        jobs.append(Job(name=f"j{k}", min_trainers=lo, max_trainers=hi, trainers=size, cpu_milli=req[0],
                        memory_bytes=req[1], gpu=req[2], nodes=tuple(placed)))
    nodes = tuple(Node(name=name, cpu_milli=cpu, memory_bytes=mem, gpu=gpu, idle_cpu_milli=f[0],
                       free_memory_bytes=f[1], free_gpu=f[2])
                  for (name, cpu, mem, gpu), f in zip(shapes, free, strict=True))
    return Cluster(nodes=nodes, jobs=tuple(jobs)), draw(st.sampled_from([0.5, 0.8, 0.97, 1.0]))


@st.composite
def full_clusters(draw) -> tuple[Cluster, float]:
    """Nodes packed with the trainers of 1-3 elastic jobs (grown round robin until none fits
    or every job is at its max), and a newcomer, wholly pending: the cluster EDL exists for."""
    count = draw(st.integers(1, 4))
    free = [[draw(st.integers(1, 16)) * 500, draw(st.integers(1, 32)) * GIB, draw(st.sampled_from([0, 2, 4]))]
            for _ in range(count)]
    shapes = [(f"n{i}", *f) for i, f in enumerate(free)]
    elastic = []
    for k in range(draw(st.integers(1, 3))):
        lo = draw(st.integers(1, 2))
        req = (draw(st.integers(1, 6)) * 500, draw(st.integers(0, 4)) * GIB, draw(st.sampled_from([0, 0, 1])))
        elastic.append([f"e{k}", lo, lo + draw(st.integers(1, 8)), req, []])
    grew = True
    while grew:
        grew = False
        for job in elastic:
            name, lo, hi, req, placed = job
            spot = next((i for i in range(count) if all(free[i][r] >= req[r] for r in range(3))), None)
            if len(placed) < hi and spot is not None:
                for r in range(3):
                    free[spot][r] -= req[r]
                placed.append(f"n{spot}")
                grew = True
    jobs = [Job(name=name, min_trainers=min(lo, len(placed)) or 1, max_trainers=hi, trainers=len(placed),
                cpu_milli=req[0], memory_bytes=req[1], gpu=req[2], nodes=tuple(placed))
            for name, lo, hi, req, placed in elastic]
    lo = draw(st.integers(1, 3))
    jobs.append(Job(name="new", min_trainers=lo, max_trainers=lo + draw(st.sampled_from([0, 2])), trainers=lo,
                    cpu_milli=draw(st.integers(1, 6)) * 500, memory_bytes=draw(st.integers(0, 4)) * GIB,
                    gpu=draw(st.sampled_from([0, 0, 1]))))
    nodes = tuple(Node(name=name, cpu_milli=cpu, memory_bytes=mem, gpu=gpu, idle_cpu_milli=f[0],
                       free_memory_bytes=f[1], free_gpu=f[2])
                  for (name, cpu, mem, gpu), f in zip(shapes, free, strict=True))
    return Cluster(nodes=nodes, jobs=tuple(jobs)), draw(st.sampled_from([0.97, 1.0]))


ANY_CLUSTER = st.one_of(clusters(), full_clusters())


def _other_load(cluster: Cluster) -> dict[str, list[int]]:
    """What pods other than the jobs' trainers take on each node."""
    load = {n.name: [n.cpu_milli - n.idle_cpu_milli, n.memory_bytes - n.free_memory_bytes, n.gpu - n.free_gpu]
            for n in cluster.nodes}
    for job in cluster.jobs:
        for node in job.nodes:
            for r, amount in enumerate((job.cpu_milli, job.memory_bytes, job.gpu)):
                load[node][r] -= amount
    return load


@EXAMPLES
@given(ANY_CLUSTER)
def test_sizes_stay_within_the_range(drawn):
    cluster, max_load = drawn
    result = plan(cluster, max_load_desired=max_load)
    for job in cluster.jobs:
        size = result.sizes[job.name]
        if not job.elastic:
            assert size == job.trainers  # load, never resized
            continue
        assert size <= job.max_trainers
        # below min only when it was already below min, and it never shrinks from there
        assert size >= min(job.min_trainers, job.trainers)
        if size < job.min_trainers:
            assert not _could_grow(cluster, result, job, max_load), job.name


def _could_grow(cluster: Cluster, result: Plan, job: Job, max_load: float) -> bool:
    """Whether rule 3 would still grow `job` by one in the planned state: a candidate, a node
    with room for one trainer, and the cluster within max_load after it."""
    some_pending = any(result.sizes[j.name] > 0 and not result.placements[j.name] for j in cluster.jobs)
    if not (some_pending or len(result.placements[job.name]) == result.sizes[job.name]):
        return False
    used = _other_load(cluster)
    for other in cluster.jobs:
        for node in result.placements[other.name]:
            for r, amount in enumerate((other.cpu_milli, other.memory_bytes, other.gpu)):
                used[node][r] += amount
    req = (job.cpu_milli, job.memory_bytes, job.gpu)
    totals = [sum(n.cpu_milli for n in cluster.nodes), sum(n.memory_bytes for n in cluster.nodes),
              sum(n.gpu for n in cluster.nodes)]
    within = all(not req[r] or sum(u[r] for u in used.values()) + req[r] <= max_load * totals[r]
                 for r in range(3))
    room = any(all(used[n.name][r] + req[r] <= (n.cpu_milli, n.memory_bytes, n.gpu)[r] for r in range(3))
               for n in cluster.nodes)
    return within and room


@EXAMPLES
@given(ANY_CLUSTER)
def test_no_node_committed_past_what_it_has(drawn):
    cluster, max_load = drawn
    result = plan(cluster, max_load_desired=max_load)
    used = _other_load(cluster)
    for job in cluster.jobs:
        assert len(result.placements[job.name]) <= result.sizes[job.name]
        for node in result.placements[job.name]:
            for r, amount in enumerate((job.cpu_milli, job.memory_bytes, job.gpu)):
                used[node][r] += amount
    for node in cluster.nodes:
        assert used[node.name][0] <= node.cpu_milli, node.name
        assert used[node.name][1] <= node.memory_bytes, node.name
        assert used[node.name][2] <= node.gpu, node.name


def _fits_after_donors_give_way(cluster: Cluster, result: Plan, starved: Job) -> bool:
    """Whether `starved` would reach its min if every elastic candidate above its min (in the
    planned state) gave way down to its min: its trainers leave from the last placed on (after
    the waiting ones), and the starved job's trainers go first fit in node order."""
    free = {n.name: [n.cpu_milli, n.memory_bytes, n.gpu] for n in cluster.nodes}
    for name, load in _other_load(cluster).items():
        for r in range(3):
            free[name][r] -= load[r]
    some_pending = any(result.sizes[j.name] > 0 and not result.placements[j.name] for j in cluster.jobs)
    for job in cluster.jobs:
        placed = list(result.placements[job.name])
        size = result.sizes[job.name]
        donor = (job.elastic and job is not starved and size > job.min_trainers
                 and (some_pending or len(placed) == size))
        if donor:
            placed = placed[:min(len(placed), job.min_trainers)]
        for node in placed:
            for r, amount in enumerate((job.cpu_milli, job.memory_bytes, job.gpu)):
                free[node][r] -= amount
    need = starved.min_trainers - len(result.placements[starved.name])
    req = (starved.cpu_milli, starved.memory_bytes, starved.gpu)
    for node in cluster.nodes:
        while need and all(free[node.name][r] >= req[r] for r in range(3)):
            for r in range(3):
                free[node.name][r] -= req[r]
            need -= 1
    return need == 0


@EXAMPLES
@given(ANY_CLUSTER)
def test_no_job_left_below_min_while_others_could_give_way(drawn):
    cluster, max_load = drawn
    result = plan(cluster, max_load_desired=max_load)
    for job in cluster.jobs:
        if len(result.placements[job.name]) < job.min_trainers <= result.sizes[job.name]:
            assert not _fits_after_donors_give_way(cluster, result, job), job.name


@EXAMPLES
@given(ANY_CLUSTER)
def test_plan_is_a_fixed_point_of_itself(drawn):
    cluster, max_load = drawn
    first = plan(cluster, max_load_desired=max_load)
    assert plan(cluster, max_load_desired=max_load) == first  # the same snapshot, the same plan
    applied = first.applied_to(cluster)
    again = plan(applied, max_load_desired=max_load)
    assert again.changes == ()
    assert again.sizes == first.sizes and again.placements == first.placements
    # no flapping: a third pass over the twice-planned cluster is still the same
    assert plan(again.applied_to(applied), max_load_desired=max_load) == again


@EXAMPLES
@given(ANY_CLUSTER)
def test_every_change_says_why(drawn):
    cluster, max_load = drawn
    result = plan(cluster, max_load_desired=max_load)
    before = {j.name: j.trainers for j in cluster.jobs}
    assert {c.job for c in result.changes} == {n for n, s in result.sizes.items() if s != before[n]}
    for change in result.changes:
        assert change.before == before[change.job] and change.after == result.sizes[change.job]
        assert change.reasons
