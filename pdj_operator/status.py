"""What a PaddleJob's status says, from what the job's master and workloads show.

Pure functions, no I/O: `paddlecloud operator` reads the master Deployment (its
`paddlecloud.org/phase` and `paddlecloud.org/epoch` annotations, written by the
leading master) and the role workloads (the pservers' and heter trainers'
StatefulSets, the trainers' Job); this module turns them into the `status` of the
PaddleJob that `kubectl get pdj` prints (phase, mode, ready/desired per role, epoch
progress) and its conditions. The operator never calls a master: masters serve TLS
to the holders of the job's tokens only, and their NetworkPolicy admits the job's pods.

What this does NOT guarantee: the phase and epoch are the master's, as last
annotated; a master that cannot write its annotations leaves the PaddleJob's status
behind it (etcd holds the truth: `paddlecloud job status`).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from typing import Any

from paddlecloud.jobspec import JobSpec
from paddlecloud.k8s import manifests
from paddlecloud.paddlejob import mode
from paddlecloud.phase import Phase

logger = logging.getLogger(__name__)

ROLE_STATUS_KEY = {manifests.PSERVER: "ps", manifests.TRAINER: "worker", manifests.HETER: "heter"}
# paddlecloud's elasticity is the trainer range (job scale); paddle-operator's level is kept as given
ELASTIC_LEVEL = "kept; the trainer range is what paddlecloud acts on"


def _annotations(deployment: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return ((deployment or {}).get("metadata") or {}).get("annotations") or {}


def master_phase(deployment: Mapping[str, Any] | None) -> str | None:
    """The phase the leading master annotated on its Deployment, None when there is none."""
    phase = _annotations(deployment).get(manifests.PHASE_ANNOTATION)
    return phase if phase in {p.value for p in Phase} else None


def master_epochs(deployment: Mapping[str, Any] | None) -> tuple[int, int] | None:
    """(current epoch, epochs) as the leading master annotated them; None before it did (no
    dataset yet), or when the annotation is not two numbers (it is logged)."""
    text = _annotations(deployment).get(manifests.EPOCH_ANNOTATION)
    if text is None:
        return None
    current, _, total = str(text).partition("/")
    if not (current.isdigit() and total.isdigit()):
        logger.warning("ignoring annotation %s=%r: not CURRENT/TOTAL epochs",
                       manifests.EPOCH_ANNOTATION, str(text)[:40])
        return None
    return int(current), int(total)


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


def epoch_progress(phase: str, epochs: tuple[int, int] | None) -> str | None:
    """"done/total" epochs: the epochs finished (all of them once the job succeeded)."""
    if epochs is None or epochs[1] <= 0:
        return None
    current, total = epochs
    done = total if phase == Phase.SUCCEEDED else current
    return f"{min(done, total)}/{total}"


def job_status(spec: JobSpec, *, deployment: Mapping[str, Any] | None,
               workloads: Mapping[str, Mapping[str, Any] | None]) -> dict[str, Any]:
    """The PaddleJob's status fields (conditions apart: see `conditions`)."""
    phase = master_phase(deployment) or Phase.PENDING.value
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
    epoch = epoch_progress(phase, master_epochs(deployment))
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


def refused_status(reason: str, message: str, *, now: str) -> dict[str, Any]:
    """The status of a job the operator refused (a bad spec): Failed, and why."""
    return {"phase": Phase.FAILED.value, "message": message,
            "conditions": [{"type": "Created", "status": "False", "reason": reason,
                            "message": message, "lastTransitionTime": now}]}


def utc_now() -> str:
    """Now, as status timestamps are written."""
    return datetime.datetime.now(tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
