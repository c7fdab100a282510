"""The planner's `Cluster`, built from what the Kubernetes API shows: nodes, pods and the
paddlecloud jobs' trainer ranges.

`build_cluster` is pure (plain dicts in, as the API serialises them); `read_objects` does the
reading (the official `kubernetes` client, synchronous: the controller calls it from its own
thread). A node's idle figures are its allocatable CPU, memory and GPUs (`nvidia.com/gpu`)
less the requests of the non-terminated pods bound to it (GPUs by limit, as the scheduler
counts them); a job's trainers are its pods labelled `paddlecloud.org/job=NAME,
paddlecloud.org/role=trainer`, ordered by their completion index (the Indexed Job removes
the highest indexes first when it shrinks, so `Job.nodes` lists them in that order).

A job is planned only when its master answered with a range (`JobRange`) and at least one of
its trainer pods exists (one trainer's requests come from it); every other pod, pservers
included, is load. What it does NOT guarantee: the snapshot is a set of separate lists, not
one consistent read; a pod bound to a node that is not (any longer) listed is ignored, and
a job whose pods disagree with the snapshot (the planner refuses it) is left out of the round.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from autoscaler.planner import Cluster, Job, Node
from paddlecloud.backends.k8s import manifests

logger = logging.getLogger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"
TERMINATED = ("Succeeded", "Failed")


@dataclass(frozen=True)
class JobRange:
    """What a job's master says of its trainers: min, max and the desired count (its size)."""

    namespace: str
    name: str
    min_trainers: int
    max_trainers: int
    desired: int

    @property
    def elastic(self) -> bool:
        return self.min_trainers < self.max_trainers


def parse_quantity(value: Any, *, what: str) -> Decimal:
    """A Kubernetes quantity ("500m", "2Gi", 4) as a number; a clear error naming a bad one."""
    from kubernetes.utils import parse_quantity as parse

    try:
        return Decimal(parse(value))
    except (ValueError, TypeError, ArithmeticError):
        raise ValueError(f"{what}: {str(value)[:40]!r} is not a Kubernetes quantity") from None


def _resources(values: Mapping[str, Any] | None, *, what: str) -> tuple[int, int, int]:
    values = values or {}
    cpu = parse_quantity(values.get("cpu", 0), what=f"{what} cpu")
    memory = parse_quantity(values.get("memory", 0), what=f"{what} memory")
    gpu = parse_quantity(values.get(GPU_RESOURCE, 0), what=f"{what} {GPU_RESOURCE}")
    return int((cpu * 1000).to_integral_value(rounding="ROUND_CEILING")), int(memory), int(gpu)


def pod_requests(pod: Mapping[str, Any]) -> tuple[int, int, int]:
    """(CPU millicores, memory bytes, GPUs) a pod holds on its node: the containers' requests
    summed (GPUs by limit, else request), or the largest init container's when that is more."""
    name = (pod.get("metadata") or {}).get("name", "?")
    spec = pod.get("spec") or {}

    def of(container: Mapping[str, Any]) -> tuple[int, int, int]:
        res = container.get("resources") or {}
        what = f"pod {name} container {container.get('name', '?')}"
        cpu, memory, _ = _resources(res.get("requests"), what=what)
        limits = res.get("limits") or {}
        gpu_from = limits if GPU_RESOURCE in limits else (res.get("requests") or {})
        return cpu, memory, _resources({GPU_RESOURCE: gpu_from.get(GPU_RESOURCE, 0)}, what=what)[2]

    running = [of(c) for c in spec.get("containers") or []]
    total = tuple(sum(r[i] for r in running) for i in range(3))
    for init in (of(c) for c in spec.get("initContainers") or []):
        total = tuple(max(a, b) for a, b in zip(total, init, strict=True))
    return total  # type: ignore[return-value]


def _live(pods: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [p for p in pods if (p.get("status") or {}).get("phase") not in TERMINATED
            and not (p.get("metadata") or {}).get("deletionTimestamp")]


def trainer_index(pod: Mapping[str, Any]) -> int | None:
    """The completion index of a trainer pod (label, else annotation), None when it has none."""
    meta = pod.get("metadata") or {}
    for source in (meta.get("labels") or {}, meta.get("annotations") or {}):
        raw = source.get(manifests.COMPLETION_INDEX_LABEL) or source.get(
            manifests.COMPLETION_INDEX_ANNOTATION)
        if raw is not None and str(raw).isdigit():
            return int(raw)
    return None


def build_cluster(*, nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
                  ranges: Iterable[JobRange]) -> Cluster:
    """The planner's snapshot of `nodes`, `pods` and the jobs of `ranges` (see the module doc)."""
    built: list[Node] = []
    used: dict[str, list[int]] = {}
    for node in nodes:
        name = node["metadata"]["name"]
        cpu, memory, gpu = _resources((node.get("status") or {}).get("allocatable"),
                                      what=f"node {name} allocatable")
        built.append(Node(name=name, cpu_milli=cpu, memory_bytes=memory, gpu=gpu))
        used[name] = [0, 0, 0]
    live = _live(pods)
    for pod in live:
        where = (pod.get("spec") or {}).get("nodeName")
        if where in used:
            for i, amount in enumerate(pod_requests(pod)):
                used[where][i] += amount
    built = [Node(name=n.name, cpu_milli=n.cpu_milli, memory_bytes=n.memory_bytes, gpu=n.gpu,
                  idle_cpu_milli=max(0, n.cpu_milli - used[n.name][0]),
                  free_memory_bytes=max(0, n.memory_bytes - used[n.name][1]),
                  free_gpu=max(0, n.gpu - used[n.name][2])) for n in built]
    jobs = []
    for job_range in ranges:
        job = _job(job_range, live=live, used=used)
        if job is not None:
            jobs.append(job)
    cluster = Cluster(nodes=tuple(built), jobs=())
    for job in jobs:  # a job the planner refuses is left out, not the whole round
        try:
            Cluster(nodes=cluster.nodes, jobs=(*cluster.jobs, job))
        except ValueError as error:
            logger.warning("job %s left out of this round: %s", job.name, error)
            continue
        cluster = Cluster(nodes=cluster.nodes, jobs=(*cluster.jobs, job))
    return cluster


def job_key(namespace: str, name: str) -> str:
    """A job's name in the planner: `namespace/name` (names are unique per namespace only)."""
    return f"{namespace}/{name}"


def _job(job_range: JobRange, *, live: list[Mapping[str, Any]],
         used: Mapping[str, list[int]]) -> Job | None:
    trainers = []
    for pod in live:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        if (meta.get("namespace") == job_range.namespace
                and labels.get(manifests.JOB_LABEL) == job_range.name
                and labels.get(manifests.ROLE_LABEL) == manifests.TRAINER):
            index = trainer_index(pod)
            if index is not None:
                trainers.append((index, pod))
    if not trainers:
        logger.debug("job %s/%s has no trainer pods yet: not planned", job_range.namespace,
                     job_range.name)
        return None
    trainers.sort(key=lambda item: item[0])
    cpu, memory, gpu = pod_requests(trainers[0][1])
    placed: dict[int, str] = {}
    for index, pod in trainers:
        where = (pod.get("spec") or {}).get("nodeName")
        if index < job_range.desired and where in used and index not in placed:
            placed[index] = where
    return Job(name=job_key(job_range.namespace, job_range.name),
               min_trainers=job_range.min_trainers, max_trainers=job_range.max_trainers,
               trainers=job_range.desired, cpu_milli=cpu, memory_bytes=memory, gpu=gpu,
               nodes=tuple(placed[i] for i in sorted(placed)))
