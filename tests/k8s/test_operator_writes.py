"""One deployer per job: over a PaddleJob's whole life the operator writes no workload.

The operator (Kopf's runner, its own client) and the job's master (its real deployer
driven by the real supervisor) run against kmock; every request the operator makes
is recorded by its User-Agent. The lifecycle covers what once made the operator
write workloads: a PodGroup applied with the PaddleJob (adopted), a trainer Job and a
pserver StatefulSet deleted by hand (re-created), a suspend (drained) and its resume,
and the PaddleJob's deletion (the garbage collector's, through owner references).
"""

from __future__ import annotations

import asyncio
from typing import Any

from test_operator import (
    GROUP,
    NS,
    PLURAL,
    VERSION,
    WORKLOADS,
    apply,
    assert_operator_rights,
    events,
    gang_job,
    operator_requests,
    put_podgroup,
    running_master,
    running_operator,
    stored_spec,
    wait_for_job,
)
from test_pdj_lifecycle import edit_spec

from paddlecloud.backends.k8s import manifests


def replicas(k8s: Any, name: str) -> int:
    return k8s.stored("deployments", NS, manifests.master_name(name))["spec"]["replicas"]


async def test_over_a_whole_lifecycle_the_operator_writes_no_workload(
        k8s_crds, api, api_client, config):
    from kubernetes import client

    k8s = k8s_crds
    batch, apps = client.BatchV1Api(api_client), client.AppsV1Api(api_client)
    put_podgroup(k8s, "life", minMember=3, queue="research")
    async with running_operator(config):
        await apply(api, gang_job("life"))
        await wait_for_job(k8s, "life")
        spec = stored_spec(k8s, "life")
        async with running_master(spec, api_client):
            await k8s.wait_for(lambda: k8s.stored("jobs", NS, "life-trainer"), what="trainers")
            group = k8s.stored("podgroups", NS, "life")
            assert group["metadata"]["labels"][manifests.JOB_LABEL] == "life"  # adopted
            await asyncio.to_thread(batch.delete_namespaced_job, "life-trainer", NS)
            await asyncio.to_thread(apps.delete_namespaced_stateful_set, "life-ps", NS)
            await k8s.wait_for(lambda: len(events(k8s, "WorkloadRecreated")) >= 1,
                               what="the workloads re-created")
            assert k8s.stored("jobs", NS, "life-trainer") and k8s.stored("statefulsets", NS,
                                                                         "life-ps")
            edit_spec(k8s, "life", suspend=True)
            await k8s.wait_for(lambda: replicas(k8s, "life") == 0, what="suspended")
        assert k8s.stored("jobs", NS, "life-trainer") is None
        edit_spec(k8s, "life", suspend=False)
        await k8s.wait_for(lambda: replicas(k8s, "life") > 0, what="resumed")
        async with running_master(spec, api_client):
            await k8s.wait_for(lambda: k8s.stored("jobs", NS, "life-trainer"), what="trainers")
        await asyncio.to_thread(api.delete_namespaced_custom_object, GROUP, VERSION, NS,
                                PLURAL, "life")
        await k8s.wait_for(lambda: k8s.stored("paddlejobs", NS, "life") is None,
                           what="the PaddleJob gone")
    # the operator read the workloads (its status), and wrote none of them
    assert {("batch", "jobs", "get"), ("apps", "statefulsets", "get")} <= operator_requests(k8s)
    assert_operator_rights(k8s)
    # ... while the master wrote every kind it deploys
    written = {r for m, r, _ in k8s.requests() if m in ("POST", "PATCH", "DELETE")}
    assert written >= WORKLOADS - {"pods"}
