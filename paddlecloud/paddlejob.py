"""The one translation of a paddle-operator `PaddleJob` into a `JobSpec`.

`paddlecloud job submit -f` and `paddlecloud operator` both call `translate` (or
`translate_documents` for a file), so both accept exactly the same YAML and give
each field the meaning paddle-operator's `api/v1/paddlejob_types.go` gives it:

* `cleanPodPolicy` Always / OnFailure / OnCompletion / Never; `intranet` PodIP /
  Service (a Service per pod) / Host (the node's network, host ports declared so
  the scheduler never puts two pods wanting one port on a node); `withGloo` 0 / 1
  (trainers) / 2 (trainers and pservers);
* `ps`, `worker`, `heter` (heterogeneous PS: heter trainers between the trainers
  and the pservers), each `replicas` plus a Kubernetes `PodTemplateSpec`; a role's
  `schedulerName` is honoured as written, on that role alone;
* `schedulingPolicy` (Volcano: minAvailable, queue, priorityClass, minResources) and
  a Volcano `PodGroup` document in the same file, applied with the job;
* `elastic` and `worker.requests` / `worker.limits`: stored as the job's elastic
  level (kept) and trainer range (min / max; the master keeps the size within it);
* paddlecloud's own keys, translated from the job model's fields alone (`own_value`,
  by their kind): `input` (a list of paths, globs or URLs), `output`, `epochs`,
  `format`, `chunkBytes` (`64MiB`, or bytes), `shuffleSeed`, `dataVolume`
  (`{claim, mountPath}`), `restartLimit` (group restarts before the job fails),
  `suspend`, and `securityProfile` (`default`, or `restricted` with the uid
  `runAsUser`, see `paddlecloud.backends.k8s.manifests.harden_user_pod`).

Every container of a template runs as written: its image, command, args, working
directory and user (paddlecloud's own part runs in containers beside it).

An unknown field is refused naming it and the nearest known one ("unknown field
spec.cleanPolicy: did you mean spec.cleanPodPolicy?").

What this does NOT guarantee: pod templates are checked only for what paddlecloud
needs of them (a container to run); the rest of a `PodTemplateSpec` is the API
server's to check (the CRD's schema, or the workload's create).
"""

from __future__ import annotations

import copy
import difflib
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from paddlecloud.jobfields import Doors, doors_of
from paddlecloud.jobspec import (
    PADDLEJOB_API_VERSION,
    PADDLEJOB_KIND,
    DataVolume,
    JobSpec,
    JobSpecError,
    chunk_bytes,
    job_fields,
)

logger = logging.getLogger(__name__)

PODGROUP_API_VERSION = "scheduling.volcano.sh/v1beta1"
PODGROUP_KIND = "PodGroup"

# paddle-operator's PaddleJobSpec, then paddlecloud's own fields.
OPERATOR_FIELDS = ("cleanPodPolicy", "schedulingPolicy", "intranet", "withGloo", "sampleSetRef",
                   "ps", "worker", "heter", "elastic")
# paddlecloud's own keys of the spec: {key: the JobSpec field}, from the job model
OWN_FIELDS = {doors_of(f).own_key: f for f in job_fields() if doors_of(f).own}
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # Kueue's LocalQueue of the job
SPEC_FIELDS = OPERATOR_FIELDS + tuple(OWN_FIELDS)
ROLE_FIELDS = ("replicas", "requests", "limits", "template")
SCHEDULING_FIELDS = ("minAvailable", "queue", "priorityClass", "minResources")
PODGROUP_SPEC_FIELDS = ("minMember", "queue", "priorityClassName", "minResources")
TEMPLATE_FIELDS = ("metadata", "spec")
DATA_VOLUME_FIELDS = ("claim", "mountPath")
METADATA_FIELDS = ("name", "namespace", "labels", "annotations", "uid", "resourceVersion",
                   "generation", "creationTimestamp", "deletionTimestamp",
                   "deletionGracePeriodSeconds", "finalizers", "managedFields", "ownerReferences",
                   "generateName", "selfLink")
INTRANET_OF = {"PodIP": "PodIP", "Service": "Service", "Host": "HostNetwork",
               "HostNetwork": "HostNetwork"}
ROLE_OF = {"ps": "pserver", "worker": "trainer", "heter": "heter"}


def refuse_unknown(given: Iterable[str], known: Iterable[str], *, where: str) -> None:
    """Raises `JobSpecError` for the first field of `given` not in `known`, with a suggestion."""
    known = tuple(known)
    for key in given:
        if key in known:
            continue
        nearest = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
        hint = (f": did you mean {where}.{nearest[0]}?" if nearest
                else f"; known fields: {', '.join(known)}")
        raise JobSpecError(f"unknown field {where}.{key}{hint}")


def _mapping(value: Any, *, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise JobSpecError(f"{where} must be a mapping, not {type(value).__name__} {value!r:.40}")
    return value


def _integer(value: Any, *, where: str, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise JobSpecError(f"invalid {where} {value!r:.40}: must be an integer >= {minimum}")
    return value


def _string(value: Any, *, where: str) -> str:
    if not isinstance(value, str):
        raise JobSpecError(f"invalid {where} {value!r:.40}: must be a string")
    return value


# ---- files ------------------------------------------------------------------------------
def load_documents(text: str, *, source: str = "the file") -> list[dict[str, Any]]:
    """The YAML documents of a file (empty ones skipped); errors name `source`."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as error:
        raise JobSpecError(f"{source} is not valid YAML: {error}") from None
    for i, doc in enumerate(docs):
        if not isinstance(doc, Mapping):
            raise JobSpecError(f"document {i + 1} of {source} is a {type(doc).__name__}, "
                               "not a Kubernetes object")
    return docs


def split_documents(docs: Iterable[Mapping[str, Any]], *, source: str = "the file"
                    ) -> tuple[Mapping[str, Any], Mapping[str, Any] | None]:
    """(the PaddleJob, the Volcano PodGroup or None): one of each at most, nothing else."""
    jobs: list[Mapping[str, Any]] = []
    groups: list[Mapping[str, Any]] = []
    for doc in docs:
        kind = doc.get("kind")
        if kind == PADDLEJOB_KIND:
            jobs.append(doc)
        elif kind == PODGROUP_KIND:
            groups.append(doc)
        else:
            raise JobSpecError(
                f"{source} holds a {kind!r} document: a PaddleJob file holds one {PADDLEJOB_KIND} "
                f"and at most one Volcano {PODGROUP_KIND}"
            )
    if len(jobs) != 1:
        raise JobSpecError(f"{source} holds {len(jobs)} {PADDLEJOB_KIND} documents: give exactly one")
    if len(groups) > 1:
        raise JobSpecError(f"{source} holds {len(groups)} {PODGROUP_KIND} documents: give at most one")
    return jobs[0], (groups[0] if groups else None)


def translate_documents(docs: Iterable[Mapping[str, Any]], *, source: str = "the file",
                        **overrides: Any) -> JobSpec:
    """`translate` of a file's documents: a PaddleJob, and its PodGroup if there is one."""
    job, group = split_documents(docs, source=source)
    return translate(job, podgroup=group, **overrides)


# ---- the translation --------------------------------------------------------------------
def translate(doc: Mapping[str, Any], *, podgroup: Mapping[str, Any] | None = None,
              **overrides: Any) -> JobSpec:
    """The `JobSpec` of a PaddleJob (`batch.paddlepaddle.org/v1`), not yet validated.

    `overrides` are JobSpec fields that win over the document when not None (the
    CLI's flags: --namespace, --input, --etcd-endpoints...; the operator's etcd).
    """
    if not isinstance(doc, Mapping):
        raise JobSpecError(f"a PaddleJob is a mapping, not {type(doc).__name__}")
    api_version, kind = doc.get("apiVersion"), doc.get("kind")
    if kind != PADDLEJOB_KIND:
        raise JobSpecError(f"kind {kind!r} is not supported: -f takes a {PADDLEJOB_KIND}")
    if api_version != PADDLEJOB_API_VERSION:
        raise JobSpecError(
            f"apiVersion {api_version!r} is not supported: use {PADDLEJOB_API_VERSION}"
        )
    refuse_unknown(doc, ("apiVersion", "kind", "metadata", "spec", "status"), where="PaddleJob")
    meta = _mapping(doc.get("metadata"), where="metadata")
    refuse_unknown(meta, METADATA_FIELDS, where="metadata")
    spec = _mapping(doc.get("spec"), where="spec")
    if "noAgent" in spec:
        raise JobSpecError("spec.noAgent is no longer needed: every container runs as written, "
                           "paddlecloud's part beside it (docs/kubernetes.md); remove it")
    refuse_unknown(spec, SPEC_FIELDS, where="spec")
    if spec.get("sampleSetRef") is not None:
        raise JobSpecError(
            "spec.sampleSetRef (paddle-operator's SampleSet cache) is not supported: mount the "
            "data with spec.dataVolume {claim, mountPath} (or --data-volume CLAIM:PATH)"
        )
    if not spec.get("worker"):
        raise JobSpecError("the PaddleJob has no spec.worker: at least one trainer is needed")

    trainers, worker_template, (low, high) = _role(spec["worker"], role="worker")
    pservers, ps_template, _ = _role(spec["ps"], role="ps") if spec.get("ps") else (0, None, (0, 0))
    heters, heter_template, _ = (_role(spec["heter"], role="heter") if spec.get("heter")
                                 else (0, None, (0, 0)))

    intranet = spec.get("intranet") or "PodIP"  # paddle-operator's default
    if intranet not in INTRANET_OF:
        raise JobSpecError(f"unsupported intranet {intranet!r}: use PodIP, Service or Host")
    with_gloo = spec.get("withGloo")
    if with_gloo is not None and with_gloo not in (0, 1, 2):
        raise JobSpecError(f"invalid spec.withGloo {with_gloo!r}: use 0 (off), 1 (trainers) or 2 "
                           "(trainers and pservers)")
    elastic = spec.get("elastic")
    if elastic is not None:
        _integer(elastic, where="spec.elastic", minimum=0)

    values: dict[str, Any] = {
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace") or "default",
        "trainers": trainers,
        "pservers": pservers,
        "heters": heters,
        "worker_template": worker_template,
        "ps_template": ps_template,
        "heter_template": heter_template,
        "min_trainers": low,
        "max_trainers": high,
        "elastic": elastic,
        "clean_pod_policy": spec.get("cleanPodPolicy") or "OnCompletion",
        "intranet": INTRANET_OF[intranet],
        "with_gloo": with_gloo or 0,
        **_scheduling(spec.get("schedulingPolicy"), podgroup, namespace=meta.get("namespace")),
        **_own_fields(spec),
        "local_queue": str(_mapping(meta.get("labels") or {}, where="metadata.labels").get(
            KUEUE_QUEUE_LABEL) or ""),
    }
    values.update({k: v for k, v in overrides.items() if v is not None})
    return JobSpec(**values)


def _role(resource: Any, *, role: str) -> tuple[int, dict[str, Any], tuple[int, int]]:
    """(replicas, pod template, (requests, limits)) of `spec.ps|worker|heter`."""
    where = f"spec.{role}"
    resource = _mapping(resource, where=where)
    refuse_unknown(resource, ROLE_FIELDS, where=where)
    replicas = _integer(resource.get("replicas"), where=f"{where}.replicas", minimum=1)
    low = resource.get("requests")
    high = resource.get("limits")
    low = replicas if low is None else _integer(low, where=f"{where}.requests", minimum=1)
    high = replicas if high is None else _integer(high, where=f"{where}.limits", minimum=1)
    if not low <= replicas <= high:
        raise JobSpecError(
            f"{where}: requests {low} <= replicas {replicas} <= limits {high} does not hold"
        )
    if role != "worker" and (low, high) != (replicas, replicas):
        raise JobSpecError(
            f"{where}.requests/limits: only trainers have a range; {role} replicas are fixed "
            f"(each {'pserver keeps its slot' if role == 'ps' else 'heter trainer keeps its endpoint'}"
            "): remove them or make them equal to replicas"
        )
    template = copy.deepcopy(dict(_mapping(resource.get("template"), where=f"{where}.template")))
    refuse_unknown(template, TEMPLATE_FIELDS, where=f"{where}.template")
    pod = dict(_mapping(template.get("spec"), where=f"{where}.template.spec"))
    containers = pod.get("containers") or []
    if not isinstance(containers, list) or not containers:
        raise JobSpecError(f"{where}.template.spec.containers is empty: give the container to run")
    for i, container in enumerate(containers):
        if not isinstance(container, Mapping) or not container.get("name"):
            raise JobSpecError(f"{where}.template.spec.containers[{i}] needs a name")
    if pod.get("schedulerName") is not None:
        _string(pod["schedulerName"], where=f"{where}.template.spec.schedulerName")
    _check_restart_policy(pod.get("restartPolicy"), role=role)
    template["spec"] = pod
    return replicas, template, (low, high)


# The policies each role's workload takes (the API server refuses the others), and why
RESTART_POLICIES = {
    "worker": (("OnFailure", "Never"), "the trainers are an Indexed Job, whose pods take OnFailure "
               "or Never (a trainer that ends by itself is replaced by the Job, and rejoins the master)"),
    "ps": (("Always",), "paddlecloud runs the pservers as a StatefulSet, whose pods take Always "
           "only (a pserver that dies is started again on its slot, and the job comes back from its "
           "checkpoint): it cannot keep a pserver down as paddle-operator's bare pods did"),
    "heter": (("Always",), "paddlecloud runs the heter trainers as a StatefulSet, whose pods take "
              "Always only"),
}


def _check_restart_policy(policy: Any, *, role: str) -> None:
    """A template's restartPolicy is kept as written, or refused naming why: never changed."""
    if policy is None:
        return
    allowed, why = RESTART_POLICIES[role]
    if policy not in allowed:
        where = f"spec.{role}.template.spec.restartPolicy"
        raise JobSpecError(f"{where} {policy!r:.20} cannot be kept: {why}; remove restartPolicy from "
                           f"spec.{role}.template.spec, or write {' or '.join(allowed)}")


def _scheduling(policy: Any, group: Mapping[str, Any] | None, *,
                namespace: str | None) -> dict[str, Any]:
    """JobSpec fields of `spec.schedulingPolicy` and of a PodGroup document (which must agree)."""
    policy = _mapping(policy, where="spec.schedulingPolicy")
    refuse_unknown(policy, SCHEDULING_FIELDS, where="spec.schedulingPolicy")
    values: dict[str, Any] = {}
    if policy.get("minAvailable") is not None:
        values["min_member"] = _integer(policy["minAvailable"],
                                        where="spec.schedulingPolicy.minAvailable", minimum=1)
    if policy.get("queue"):
        values["queue"] = _string(policy["queue"], where="spec.schedulingPolicy.queue")
    if policy.get("priorityClass"):
        values["priority_class"] = _string(policy["priorityClass"],
                                           where="spec.schedulingPolicy.priorityClass")
    if policy.get("minResources"):
        values["min_resources"] = _resources(policy["minResources"],
                                             where="spec.schedulingPolicy.minResources")
    if group is None:
        return values

    if group.get("apiVersion") != PODGROUP_API_VERSION:
        raise JobSpecError(f"PodGroup apiVersion {group.get('apiVersion')!r} is not supported: "
                           f"use {PODGROUP_API_VERSION}")
    refuse_unknown(group, ("apiVersion", "kind", "metadata", "spec"), where="PodGroup")
    meta = _mapping(group.get("metadata"), where="PodGroup metadata")
    name = _string(meta.get("name") or "", where="PodGroup metadata.name")
    if not name:
        raise JobSpecError("the PodGroup document has no metadata.name")
    if (meta.get("namespace") or "default") != (namespace or "default"):
        raise JobSpecError(
            f"PodGroup {name} is in namespace {meta.get('namespace')!r}, the PaddleJob in "
            f"{namespace or 'default'!r}: a PodGroup groups pods of its own namespace only"
        )
    body = _mapping(group.get("spec"), where=f"PodGroup {name} spec")
    refuse_unknown(body, PODGROUP_SPEC_FIELDS, where=f"PodGroup {name} spec")
    from_group: dict[str, Any] = {"podgroup_name": name}
    if body.get("minMember") is not None:
        from_group["min_member"] = _integer(body["minMember"], where=f"PodGroup {name} minMember",
                                            minimum=1)
    if body.get("queue"):
        from_group["queue"] = _string(body["queue"], where=f"PodGroup {name} queue")
    if body.get("priorityClassName"):
        from_group["priority_class"] = _string(body["priorityClassName"],
                                               where=f"PodGroup {name} priorityClassName")
    if body.get("minResources"):
        from_group["min_resources"] = _resources(body["minResources"],
                                                 where=f"PodGroup {name} minResources")
    for key, value in from_group.items():
        if key in values and values[key] != value:
            raise JobSpecError(
                f"spec.schedulingPolicy and PodGroup {name} disagree on {key} ({values[key]!r} "
                f"vs {value!r}): give it in one place"
            )
    return {**values, **from_group}


def _resources(value: Any, *, where: str) -> dict[str, str]:
    value = _mapping(value, where=where)
    return {str(k): str(v) for k, v in value.items()}


def _own_fields(spec: Mapping[str, Any]) -> dict[str, Any]:
    """JobSpec fields of paddlecloud's own PaddleJob keys (input, output, epochs...)."""
    return {f.name: own_value(doors_of(f), spec[key], where=f"spec.{key}")
            for key, f in OWN_FIELDS.items() if spec.get(key) is not None}


def own_keys(spec: JobSpec) -> dict[str, Any]:
    """paddlecloud's own keys of a PaddleJob's spec that write `spec`'s values (those that
    differ from the model's defaults): `translate` reads them back as they were."""
    return {key: _yaml_of(getattr(spec, f.name)) for key, f in OWN_FIELDS.items()
            if getattr(spec, f.name) != f.default}


def _yaml_of(value: Any) -> Any:
    if isinstance(value, DataVolume):
        return {"claim": value.claim, "mountPath": value.mount_path}
    return list(value) if isinstance(value, tuple) else value


def own_value(doors: Doors, value: Any, *, where: str) -> Any:
    """The JobSpec value of a YAML (or JSON) value of a field of `doors.kind`; errors name it."""
    match doors.kind:
        case "paths":
            if not isinstance(value, list) or not value:
                raise JobSpecError(f"invalid {where} {value!r:.40}: give a list of paths, "
                                   "globs or URLs, e.g. ['/data/train-*.csv']")
            return tuple(_string(i, where=f"{where} item") for i in value)
        case "count":
            return _integer(value, where=where, minimum=doors.minimum or 0)
        case "integer":
            if not isinstance(value, int) or isinstance(value, bool):
                raise JobSpecError(f"invalid {where} {value!r:.40}: must be an integer")
            return value
        case "flag":
            if not isinstance(value, bool):
                raise JobSpecError(f"invalid {where} {value!r:.40}: true or false")
            return value
        case "size":
            return chunk_bytes(value, where=where)
        case "volume":
            volume = _mapping(value, where=where)
            refuse_unknown(volume, DATA_VOLUME_FIELDS, where=where)
            return DataVolume(claim=_string(volume.get("claim") or "", where=f"{where}.claim"),
                              mount_path=_string(volume.get("mountPath") or "",
                                                 where=f"{where}.mountPath"))
        case _:  # text and choice: JobSpec.validate names a value out of its choices
            return _string(value, where=where)


def mode(spec: JobSpec) -> str:
    """paddle-operator's job mode: PS (pservers), Collective (several trainers), Single."""
    if spec.pservers:
        return "PS"
    return "Collective" if spec.trainers > 1 else "Single"
