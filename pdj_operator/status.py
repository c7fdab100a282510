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
from dataclasses import dataclass
from typing import Any

from paddlecloud.backends.k8s import manifests
from paddlecloud.jobspec import JobSpec
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


def _pair(deployment: Mapping[str, Any] | None, key: str, *, what: str) -> tuple[int, int] | None:
    """The annotation `key` as two numbers "A/B"; None before the master wrote it, or when it
    is not two numbers (it is logged, naming `what` they should be)."""
    text = _annotations(deployment).get(key)
    if text is None:
        return None
    first, _, second = str(text).partition("/")
    if not (first.isdigit() and second.isdigit()):
        logger.warning("ignoring annotation %s=%r: not %s", key, str(text)[:40], what)
        return None
    return int(first), int(second)


def master_epochs(deployment: Mapping[str, Any] | None) -> tuple[int, int] | None:
    """(current epoch, epochs) as the leading master annotated them; None before it did (no
    dataset yet), or when the annotation is not two numbers (it is logged)."""
    return _pair(deployment, manifests.EPOCH_ANNOTATION, what="CURRENT/TOTAL epochs")


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


def master_tasks(deployment: Mapping[str, Any] | None) -> tuple[int, int] | None:
    """(tasks done, tasks) of the current epoch as the leading master annotated them."""
    return _pair(deployment, manifests.TASKS_ANNOTATION, what="DONE/TOTAL tasks")


def percent_done(phase: str, epochs: tuple[int, int] | None,
                 tasks: tuple[int, int] | None) -> int | None:
    """The whole job's progress in percent: epochs done, plus the current epoch's share of
    tasks done; None before the master has a dataset."""
    if phase == Phase.SUCCEEDED:
        return 100
    if epochs is None or epochs[1] <= 0:
        return None
    current, total = epochs
    share = tasks[0] / tasks[1] if tasks and tasks[1] > 0 else 0.0
    return max(0, min(100, int(100 * (min(current, total) + share) / total)))


def goodput(deployment: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The job's goodput as the leading master annotated it ("cause=seconds,..."): the
    productive share in percent, the productive seconds and the lost ones by cause; None before
    it wrote any second (a malformed annotation is logged and ignored)."""
    text = _annotations(deployment).get(manifests.GOODPUT_ANNOTATION)
    if not text:
        return None
    figures: dict[str, int] = {}
    for part in str(text).split(","):
        cause, _, seconds = part.partition("=")
        if not (cause.replace("_", "").isalpha() and seconds.isdigit()):
            logger.warning("ignoring annotation %s=%r: not cause=seconds,...",
                           manifests.GOODPUT_ANNOTATION, str(text)[:40])
            return None
        figures[cause] = int(seconds)
    total = sum(figures.values())
    if total == 0:
        return None
    productive = figures.pop("productive", 0)
    return {"productivePercent": int(100 * productive / total), "productiveSeconds": productive,
            "lostSeconds": {cause: seconds for cause, seconds in figures.items() if seconds}}


def eta(percent: int | None, *, running_for: float) -> str | None:
    """How long the job has left at its own average rate so far (`running_for` seconds since
    it started running), as "1h2m3s"; None with no progress to extrapolate from."""
    if percent is None or percent <= 0 or running_for <= 0:
        return None
    left = int(running_for * (100 - percent) / percent)
    hours, rest = divmod(left, 3600)
    minutes, seconds = divmod(rest, 60)
    return (f"{hours}h" if hours else "") + (f"{minutes}m" if hours or minutes else "") + \
        f"{seconds}s"


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
    epochs = master_epochs(deployment)
    epoch = epoch_progress(phase, epochs)
    if epoch is not None:
        out["epoch"] = epoch
    percent = percent_done(phase, epochs, master_tasks(deployment))
    if percent is not None:
        out["percentDone"] = percent
    figures = goodput(deployment)
    if figures is not None:
        out["goodput"] = figures
    return out


# The conditions every PaddleJob carries (docs/design.md §12), in this order.
CONDITION_TYPES = ("Created", "Running", "Restarting", "Suspended", "Succeeded", "Failed")


@dataclass(frozen=True)
class Observed:
    """What the operator saw of a job in one look: what its conditions are made from."""

    phase: str
    generation: int = 0
    suspended: str = ""
    """Why no pods run though the job is not over: SuspendedBySpec, WaitingForAdmission,
    EvictedByKueue; "" when it may run."""
    restarting: str = ""
    """The master's reason for the group restart under way (its Deployment's annotation)."""
    message: str = ""
    """What went wrong, for a Failed job."""
    created: str = "MasterCreated"
    """MasterCreated, or Held: a job held before it ever ran has no master yet."""


def _wanted(seen: Observed) -> dict[str, tuple[bool, str, str]]:
    """Condition type -> (holds, machine-readable reason, message)."""
    over = seen.phase in (Phase.SUCCEEDED, Phase.FAILED)
    running = seen.phase == Phase.RUNNING and not seen.suspended and not seen.restarting
    if over:
        why_not_running = f"Job{seen.phase}"
    elif seen.suspended:
        why_not_running = seen.suspended
    elif seen.restarting:
        why_not_running = "Restarting"
    else:
        why_not_running = seen.phase  # Pending, Starting
    return {
        "Created": (True, seen.created, CREATED_MESSAGES.get(seen.created, "")),
        "Running": (running, "TrainersRunning" if running else why_not_running,
                    "the trainers train" if running else f"phase {seen.phase}"),
        "Restarting": (bool(seen.restarting) and not over,
                       "GroupRestart" if seen.restarting and not over else "NotRestarting",
                       seen.restarting),
        "Suspended": (bool(seen.suspended) and not over,
                      seen.suspended if seen.suspended and not over else "NotSuspended",
                      SUSPEND_MESSAGES.get(seen.suspended, "") if not over else ""),
        "Succeeded": (seen.phase == Phase.SUCCEEDED,
                      "AllEpochsDone" if seen.phase == Phase.SUCCEEDED else "NotSucceeded", ""),
        "Failed": (seen.phase == Phase.FAILED,
                   "JobFailed" if seen.phase == Phase.FAILED else "NotFailed", seen.message),
    }


CREATED_MESSAGES = {
    "MasterCreated": "the job's master Deployment exists",
    "Held": "the job is held before it starts: its master is created once it may run",
}
SUSPEND_MESSAGES = {
    "SuspendedBySpec": "spec.suspend is true: no pserver or trainer runs until it is false",
    "WaitingForAdmission": "the job waits for Kueue to admit its Workload",
    "EvictedByKueue": "Kueue evicted the job (preempted): it runs again when re-admitted",
}


def conditions(seen: Observed, *, now: str,
               previous: list[Mapping[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The PaddleJob's `status.conditions`, each a `metav1.Condition` (type, status, reason,
    message, lastTransitionTime, observedGeneration); a condition's transition time moves
    only when its status flips, as `kubectl wait --for=condition=...` expects."""
    old = {c.get("type"): c for c in previous or []}
    out = []
    for kind, (holds, reason, message) in _wanted(seen).items():
        status = "True" if holds else "False"
        before = old.get(kind) or {}
        since = before.get("lastTransitionTime") if before.get("status") == status else None
        out.append({"type": kind, "status": status, "reason": reason, "message": message,
                    "lastTransitionTime": since or now, "observedGeneration": seen.generation})
    return out


def invalid_spec_conditions(message: str, *, generation: int, now: str,
                            reason: str = "InvalidSpec") -> list[dict[str, Any]]:
    """The conditions of a job whose spec cannot run: not Created (`reason`), and Failed."""
    out = conditions(Observed(phase=Phase.FAILED.value, generation=generation, message=message),
                     now=now)
    out[0].update(status="False", reason=reason, message=message)
    return out


def refused_status(reason: str, message: str, *, now: str, generation: int = 0) -> dict[str, Any]:
    """The status of a job the operator refused (a bad spec, a name taken): Failed, and why."""
    return {"phase": Phase.FAILED.value, "message": message,
            "conditions": invalid_spec_conditions(message, generation=generation, now=now,
                                                  reason=reason)}


def utc_now() -> str:
    """Now, as status timestamps are written."""
    return datetime.datetime.now(tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
