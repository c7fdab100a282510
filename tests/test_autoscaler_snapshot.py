"""The planner's snapshot built from Kubernetes objects (autoscaler/snapshot.py): pure, no API."""

from __future__ import annotations

from typing import Any

import pytest

from autoscaler.planner import describe
from autoscaler.snapshot import JobRange, build_cluster, pod_requests
from paddlecloud.backends.k8s import manifests

pytestmark = pytest.mark.unit

GI = 1024**3


def node(name: str, *, cpu: str = "4", memory: str = "16Gi", gpu: str | None = None) -> dict[str, Any]:
    allocatable = {"cpu": cpu, "memory": memory, **({"nvidia.com/gpu": gpu} if gpu else {})}
    return {"metadata": {"name": name}, "status": {"allocatable": allocatable}}


def pod(name: str, *, on: str | None, cpu: str = "1", memory: str = "1Gi", phase: str = "Running",
        job: str | None = None, index: int | None = None, gpu_limit: str | None = None,
        namespace: str = "ml") -> dict[str, Any]:
    labels = {}
    if job:
        labels = {manifests.JOB_LABEL: job, manifests.ROLE_LABEL: manifests.TRAINER}
        if index is not None:
            labels[manifests.COMPLETION_INDEX_LABEL] = str(index)
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}}
    if gpu_limit:
        resources["limits"] = {"nvidia.com/gpu": gpu_limit}
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"nodeName": on, "containers": [{"name": "c", "resources": resources}]},
            "status": {"phase": phase}}


def test_idle_figures_are_allocatable_less_live_pods_and_gpus_count_by_limit():
    cluster = build_cluster(
        nodes=[node("n1", gpu="2"), node("n2")],
        pods=[pod("load", on="n1", cpu="500m", memory="2Gi", gpu_limit="1"),
              pod("done", on="n1", cpu="3", phase="Succeeded"),  # terminated: frees its node
              pod("failed", on="n2", cpu="3", phase="Failed"),
              pod("pending", on=None, cpu="3")],  # not bound: holds no node
        ranges=[])
    n1, n2 = cluster.nodes
    assert (n1.cpu_milli, n1.idle_cpu_milli, n1.free_memory_bytes, n1.free_gpu) == (4000, 3500, 14 * GI, 1)
    assert (n2.idle_cpu_milli, n2.free_memory_bytes, n2.free_gpu) == (4000, 16 * GI, 0)


def test_a_jobs_trainers_are_listed_by_completion_index_and_those_beyond_its_size_are_load():
    pods = [pod("t2", on="n2", job="a", index=2), pod("t0", on="n1", job="a", index=0),
            pod("t1", on=None, job="a", index=1, phase="Pending"),
            pod("t3", on="n1", job="a", index=3),  # being removed: the job was scaled to 3
            pod("ps", on="n2", job=None), pod("other-ns", on="n2", job="a", index=0, namespace="x")]
    cluster = build_cluster(nodes=[node("n1"), node("n2")], pods=pods,
                            ranges=[JobRange(namespace="ml", name="a", min_trainers=1, max_trainers=4,
                                             desired=3)])
    (job,) = cluster.jobs
    assert job.name == "ml/a" and job.trainers == 3 and (job.min_trainers, job.max_trainers) == (1, 4)
    assert job.nodes == ("n1", "n2")  # index 0 then 2; index 1 waits; index 3 is load
    assert (job.cpu_milli, job.memory_bytes, job.gpu) == (1000, GI, 0)
    assert cluster.nodes[0].idle_cpu_milli == 2000  # t0 and t3 both hold n1


def test_a_job_without_trainer_pods_is_not_planned():
    cluster = build_cluster(nodes=[node("n1")], pods=[],
                            ranges=[JobRange(namespace="ml", name="a", min_trainers=1, max_trainers=2,
                                             desired=1)])
    assert cluster.jobs == ()


def test_init_containers_count_when_they_ask_more():
    body = pod("p", on="n1", cpu="1", memory="1Gi")
    body["spec"]["initContainers"] = [{"name": "i", "resources": {"requests": {"cpu": "2"}}}]
    assert pod_requests(body) == (2000, GI, 0)


def test_a_bad_quantity_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"node n1 allocatable cpu: 'four-cores'"):
        build_cluster(nodes=[node("n1", cpu="four-cores")], pods=[], ranges=[])


def test_an_inquiry_is_one_line_of_totals_idle_per_node_and_each_job_s_demand():
    """What EDL's controller logged (`Cluster.InquiryResource done resource={NodeCount ...
    CPUTotalMilli ... Nodes:{NodesCPUIdleMilli ...}}`), in one line people read."""
    cluster = build_cluster(
        nodes=[node("n1", cpu="2", memory="2Gi", gpu="1"), node("n2", cpu="4")],
        pods=[pod("t0", on="n1", cpu="500m", memory="512Mi", job="a", index=0, gpu_limit="1"),
              pod("t1", on=None, cpu="500m", memory="512Mi", job="a", index=1, phase="Pending"),
              pod("web", on="n2", cpu="1", memory="1Gi")],
        ranges=[JobRange(namespace="ml", name="a", min_trainers=1, max_trainers=4, desired=2)])
    line = describe(cluster)
    assert "\n" not in line
    assert line.startswith("2 node(s): cpu idle 4500m of 6000m, memory free 16896Mi of 18432Mi, "
                           "gpu free 0 of 1; "), line
    assert ("idle/total per node: n1 cpu 1500m/2000m mem 1536Mi/2048Mi gpu 0/1, "
            "n2 cpu 3000m/4000m mem 15360Mi/16384Mi gpu 0/0; ") in line
    assert line.endswith("1 job(s): ml/a 2 trainers (1 placed, range 1..4, each cpu 500m mem 512Mi gpu 1)")
    empty = describe(build_cluster(nodes=[node("n1")], pods=[], ranges=[]))
    assert empty == ("1 node(s): cpu idle 4000m of 4000m, memory free 16384Mi of 16384Mi, gpu free 0 of 0; "
                     "idle/total per node: n1 cpu 4000m/4000m mem 16384Mi/16384Mi gpu 0/0; 0 job(s): none")
