"""A queued PaddleJob as Kueue sees it: ONE Workload covering all its pods, and its admission.

Kueue admits a workload as a whole; paddlecloud's job is a master plus pservers,
heter trainers and trainers created by three controllers (a Deployment, StatefulSets,
an Indexed Job). Of Kueue's mechanisms, the one that covers all of them as one
workload from a controller written in Python is Kueue's *external framework*
contract: the operator creates a `kueue.x-k8s.io/v1beta2` Workload owned by the
PaddleJob, one pod set per role, holds the job while the Workload is not admitted,
runs it once Kueue admits it, and stops it when Kueue evicts it (preemption) —
what Kueue's own job integrations do for a batch Job. Pod groups of plain Pods do
not fit (Kueue skips pods owned by a batch Job, and our trainers are one), nor does
a JobSet (a rewrite of every workload); docs/kubernetes.md, "Kueue", says more.

The trainer range goes to Kueue as partial admission: the trainer pod set asks for
the most trainers (`count`) and accepts the fewest (`minCount`); the job starts
with what Kueue admitted.

Pure functions, no I/O: `pdj_operator.handlers` makes the calls.

What this does NOT guarantee: that Kueue runs (without it a queued job waits for
ever, its Suspended condition says so), nor that the cluster's Kueue takes
`minCount` (the PartialAdmission feature, on by default since Kueue 0.5).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from paddlecloud.backends.k8s import manifests
from paddlecloud.jobspec import JobSpec

# v1beta2: served since Kueue 0.15, the only version since 0.20 (which stopped serving v1beta1)
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
WORKLOADS = "workloads"
MASTER_POD_SET = "master"


def workload_name(job: str) -> str:
    return f"paddlejob-{job}"


def _pod_template(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A workload's pod template, as Kueue counts it (requests, node selectors)."""
    template = dict(obj["spec"]["template"])
    return {"metadata": {"labels": dict((template.get("metadata") or {}).get("labels") or {})},
            "spec": template["spec"]}


def pod_sets(spec: JobSpec) -> list[dict[str, Any]]:
    """One pod set per role that has pods, and one for the master (its pod counts too)."""
    most = spec.replace(trainers=spec.trainer_range.maximum)
    master = next(o for o in manifests.submit_objects(spec) if o["kind"] == "Deployment")
    sets = [{"name": MASTER_POD_SET, "count": 1, "template": _pod_template(master)}]
    if spec.pservers:
        sets.append({"name": manifests.PSERVER, "count": spec.pservers,
                     "template": _pod_template(manifests.pserver_statefulset(spec, None))})
    if spec.heters:
        sets.append({"name": manifests.HETER, "count": spec.heters,
                     "template": _pod_template(manifests.heter_statefulset(spec, None))})
    trainers: dict[str, Any] = {"name": manifests.TRAINER, "count": most.trainers,
                                "template": _pod_template(manifests.trainer_job(most, None))}
    if spec.trainer_range.minimum < spec.trainer_range.maximum:
        trainers["minCount"] = spec.trainer_range.minimum  # Kueue's partial admission
    sets.append(trainers)
    return sets


def workload(spec: JobSpec, owner: Mapping[str, Any]) -> dict[str, Any]:
    """The job's Workload in its LocalQueue, owned by the PaddleJob."""
    return {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "Workload",
        "metadata": {"name": workload_name(spec.name), "namespace": spec.namespace,
                     "labels": {manifests.APP_LABEL: manifests.APP_NAME,
                                manifests.JOB_LABEL: spec.name},
                     "ownerReferences": [dict(owner)]},
        "spec": {"queueName": spec.local_queue, "podSets": pod_sets(spec)},
    }


def _condition(wl: Mapping[str, Any] | None, kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True"
               for c in ((wl or {}).get("status") or {}).get("conditions") or [])


def hold_reason(wl: Mapping[str, Any] | None) -> str:
    """Why Kueue holds the job ("" when it may run): EvictedByKueue or WaitingForAdmission."""
    if _condition(wl, "Evicted"):
        return "EvictedByKueue"
    if not _condition(wl, "Admitted"):
        return "WaitingForAdmission"
    return ""


def admitted_trainers(wl: Mapping[str, Any] | None, spec: JobSpec) -> int:
    """The trainers the job may start with: its own size, at most what Kueue admitted."""
    admission = ((wl or {}).get("status") or {}).get("admission") or {}
    for assignment in admission.get("podSetAssignments") or []:
        if assignment.get("name") == manifests.TRAINER and assignment.get("count") is not None:
            span = spec.trainer_range
            return max(span.minimum, min(spec.trainers, int(assignment["count"])))
    return spec.trainers


def released_status(wl: Mapping[str, Any], *, now: str) -> dict[str, Any]:
    """The Workload status patch after the job it evicted has stopped: its quota given back
    (no admission, QuotaReserved False), as Kueue's own job integrations do, so it queues
    again."""
    conditions = [dict(c) for c in (wl.get("status") or {}).get("conditions") or []
                  if c.get("type") not in ("QuotaReserved", "Admitted")]
    for kind in ("QuotaReserved", "Admitted"):
        conditions.append({"type": kind, "status": "False", "reason": "Pending",
                           "message": "the PaddleJob stopped after its eviction",
                           "lastTransitionTime": now})
    return {"status": {"admission": None, "conditions": conditions}}

