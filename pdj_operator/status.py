"""What a PaddleJob's status says, from what the job's master and workloads show.

Pure functions, no I/O: `paddlecloud operator` reads the master Deployment (its
`paddlecloud.org/phase` annotation, written by the leading master), the role
workloads (the pservers' and heter trainers' StatefulSets, the trainers' Job) and,
when it can reach it, the master's `GetStatus` (epochs); this module turns them
into the `status` of the PaddleJob that `kubectl get pdj` prints (phase, mode,
ready/desired per role, epoch progress) and its conditions.

What this does NOT guarantee: the phase is the master's, as last annotated; a
master that cannot write its annotation leaves the PaddleJob's phase behind it
(etcd holds the truth: `paddlecloud job status`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from paddlecloud.jobspec import JobSpec
from paddlecloud.k8s import manifests
from paddlecloud.paddlejob import mode
from paddlecloud.phase import Phase

logger = logging.getLogger(__name__)

ROLE_STATUS_KEY = {manifests.PSERVER: "ps", manifests.TRAINER: "worker", manifests.HETER: "heter"}
# paddlecloud's elasticity is the trainer range (job scale); paddle-operator's level is kept as given
ELASTIC_LEVEL = "kept; the trainer range is what paddlecloud acts on"


@dataclass(frozen=True)
class MasterView:
    """The fields of the master's GetStatus the status shows."""

    phase: str
    current_epoch: int
    num_epochs: int
    has_dataset: bool


def master_phase(deployment: Mapping[str, Any] | None) -> str | None:
    """The phase the leading master annotated on its Deployment, None when there is none."""
    if deployment is None:
        return None
    annotations = (deployment.get("metadata") or {}).get("annotations") or {}
    phase = annotations.get(manifests.PHASE_ANNOTATION)
    return phase if phase in {p.value for p in Phase} else None


def role_counts(role: str, workload: Mapping[str, Any] | None, *, desired: int) -> dict[str, Any]:
    """desired/ready/active/succeeded/failed of a role, and `summary` = "ready/desired"."""
    status = (workload or {}).get("status") or {}
    if role == manifests.TRAINER:
        ready = int(status.get("ready") or 0)
        counts = {"desired": desired, "ready": ready, "active": int(status.get("active") or 0),
                  "succeeded": int(status.get("succeeded") or 0),
                  "failed": int(status.get("failed") or 0)}
    else:
        ready = int(status.get("readyReplicas") or 0)
        counts = {"desired": desired, "ready": ready}
    counts["summary"] = f"{ready}/{desired}"
    return counts


def epoch_progress(master: MasterView | None) -> str | None:
    """"done/total" epochs: the epochs finished (all of them once the job succeeded)."""
    if master is None or not master.has_dataset or master.num_epochs <= 0:
        return None
    done = master.num_epochs if master.phase == Phase.SUCCEEDED else master.current_epoch
    return f"{min(done, master.num_epochs)}/{master.num_epochs}"


def job_status(spec: JobSpec, *, deployment: Mapping[str, Any] | None,
               workloads: Mapping[str, Mapping[str, Any] | None],
               master: MasterView | None) -> dict[str, Any]:
    """The PaddleJob's status fields (conditions apart: see `conditions`)."""
    phase = (master.phase if master is not None and master.phase else None) \
        or master_phase(deployment) or Phase.PENDING.value
    span = spec.trainer_range
    out: dict[str, Any] = {
        "phase": phase,
        "mode": mode(spec),
        "trainerRange": f"{span.minimum}..{span.maximum}",
        "master": manifests.master_endpoint(spec),
    }
    if spec.elastic is not None:
        out["elastic"] = f"level {spec.elastic}: {ELASTIC_LEVEL}"
    for role in (manifests.PSERVER, manifests.HETER, manifests.TRAINER):
        desired = spec.replicas_of(role)
        if desired:
            out[ROLE_STATUS_KEY[role]] = role_counts(role, workloads.get(role), desired=desired)
    epoch = epoch_progress(master)
    if epoch is not None:
        out["epoch"] = epoch
    return out


def conditions(phase: str, *, now: str, previous: list[Mapping[str, Any]] | None = None,
               message: str = "") -> list[dict[str, Any]]:
    """Created/Running/Succeeded/Failed conditions; a condition's transition time moves only
    when its status changes."""
    wanted = {
        "Created": "True",
        "Running": "True" if phase == Phase.RUNNING else "False",
        "Succeeded": "True" if phase == Phase.SUCCEEDED else "False",
        "Failed": "True" if phase == Phase.FAILED else "False",
    }
    old = {c.get("type"): c for c in previous or []}
    out = []
    for kind, status in wanted.items():
        before = old.get(kind) or {}
        since = before.get("lastTransitionTime") if before.get("status") == status else None
        condition = {"type": kind, "status": status, "reason": phase,
                     "lastTransitionTime": since or now}
        if message and status == "True" and kind == "Failed":
            condition["message"] = message
        out.append(condition)
    return out
