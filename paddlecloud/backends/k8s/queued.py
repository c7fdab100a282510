"""`job submit --queue NAME -f job.yaml`: a job Kueue admits, submitted as a PaddleJob.

Kueue admits a job through a Workload the job's controller creates and follows
(docs/kubernetes.md, "Kueue"); for paddlecloud that controller is `paddlecloud
operator`, which runs PaddleJobs. So a queued submit does not create the master as
`job submit` does: it creates the PaddleJob, labelled `kueue.x-k8s.io/queue-name`, with
the flags a PaddleJob can hold written into its spec, and the operator takes it from
there. A flag a PaddleJob cannot hold (an image, a module, a package, environment) is a
contradiction, refused by name: the PaddleJob's pod templates say those.

What this does NOT guarantee: that the operator runs in the namespace, nor that Kueue
lists PaddleJobs among its external frameworks (the job then waits, Suspended).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from paddlecloud.jobfields import Doors, doors_of
from paddlecloud.jobspec import PADDLEJOB_KIND, DataVolume, JobSpecError, job_fields
from paddlecloud.paddlejob import KUEUE_QUEUE_LABEL, translate


def _paddlejob_value(doors: Doors) -> Callable[[Any], Any]:
    """How an option's value is written in the PaddleJob's spec, by the field's kind."""
    match doors.kind:
        case "paths":
            return list
        case "count" | "integer":
            return int
        case "volume":
            return lambda v: {"claim": DataVolume.parse(v).claim,
                              "mountPath": DataVolume.parse(v).mount_path}
    return (lambda v: doors.flag_value) if doors.flag_value is not None else str


# submit's options a PaddleJob holds (paddlecloud's own keys of the job model) -> its spec
# field and how the value is written there
SPEC_FLAGS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    doors_of(f).flag: (doors_of(f).own_key, _paddlejob_value(doors_of(f)))
    for f in job_fields() if doors_of(f).own and doors_of(f).flag}
# options that shape nothing of the job (or that queued_paddlejob reads itself)
NEUTRAL = {"namespace", "queue"}


def _given(value: Any) -> bool:
    return not (value is None or value is False or value in ((), ""))  # never `in`: 0 == False


def queued_paddlejob(docs: list[dict[str, Any]], *, queue: str, name: str | None,
                     options: Mapping[str, Any]) -> dict[str, Any]:
    """The PaddleJob to create from a file's documents and submit's options; raises
    `JobSpecError` naming a contradiction or a bad value."""
    jobs = [d for d in docs if d.get("kind") == PADDLEJOB_KIND]
    if len(docs) != 1 or len(jobs) != 1:
        raise JobSpecError(
            f"--queue submits one PaddleJob and the file holds {len(docs)} document(s): apply "
            f"a PodGroup or other objects with kubectl, and the PaddleJob with --queue")
    refused = sorted(f"--{k.replace('_', '-')}" for k, v in options.items()
                     if _given(v) and k not in SPEC_FLAGS and k not in NEUTRAL)
    if refused:
        raise JobSpecError(
            f"{', '.join(refused)} cannot be combined with --queue (or the file's "
            f"{KUEUE_QUEUE_LABEL} label): a queued job is the "
            "PaddleJob as written (the operator runs it once Kueue admits it); set these in its "
            "pod templates")
    doc = copy.deepcopy(jobs[0])
    meta = doc.setdefault("metadata", {})
    labels = meta.setdefault("labels", {}) or {}
    if labels.get(KUEUE_QUEUE_LABEL) not in (None, queue):
        raise JobSpecError(
            f"--queue {queue[:64]!r} contradicts the file's label {KUEUE_QUEUE_LABEL}="
            f"{str(labels[KUEUE_QUEUE_LABEL])[:64]!r}: give one of them")
    meta["labels"] = {**labels, KUEUE_QUEUE_LABEL: queue}
    if name:
        meta["name"] = name
    if options.get("namespace"):
        meta["namespace"] = options["namespace"]
    meta.setdefault("namespace", "default")
    for option, (field, convert) in SPEC_FLAGS.items():
        if _given(options.get(option)):
            doc.setdefault("spec", {})[field] = convert(options[option])
    translate(doc).validate()  # the operator's own reading: a bad value is refused here
    return doc
