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
* paddlecloud's own: `input` (a list of paths, globs or URLs), `output`,
  `epochs`, `format`, `chunkBytes` (`64MiB`, or bytes), `dataVolume`
  (`{claim, mountPath}`), `restartLimit` (group restarts before the job fails), and
  `securityProfile` (`default`, or `restricted` with the uid `runAsUser`, see
  `paddlecloud.backends.k8s.manifests.harden_user_pod`).

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

from paddlecloud.jobspec import (
    PADDLEJOB_API_VERSION,
    PADDLEJOB_KIND,
    DataVolume,
    JobSpec,
    JobSpecError,
)
from paddlecloud.units import parse_size

logger = logging.getLogger(__name__)

PODGROUP_API_VERSION = "scheduling.volcano.sh/v1beta1"
PODGROUP_KIND = "PodGroup"

# paddle-operator's PaddleJobSpec, then paddlecloud's own fields.
OPERATOR_FIELDS = ("cleanPodPolicy", "schedulingPolicy", "intranet", "withGloo", "sampleSetRef",
                   "ps", "worker", "heter", "elastic")
OWN_FIELDS = ("input", "output", "epochs", "format", "chunkBytes", "dataVolume", "restartLimit",
              "suspend", "securityProfile", "runAsUser")
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # Kueue's LocalQueue of the job
SPEC_FIELDS = OPERATOR_FIELDS + OWN_FIELDS
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
    template["spec"] = pod
    return replicas, template, (low, high)


TEMPLATE_ROLES = {"ps_template": "ps", "worker_template": "worker", "heter_template": "heter"}
ALLOWED_CAPABILITIES = {"NET_BIND_SERVICE"}  # the one the restricted profile lets a pod add


def unsafe_template_fields(template: Mapping[str, Any], *, where: str) -> list[str]:
    """The fields of a pod template beyond the restricted Pod Security Standard (host
    namespaces, privileged, hostPath, root, escalation, added capabilities, no seccomp) or
    giving it a service account's API rights, as paths under `where`."""
    pod = template.get("spec") or {}
    found = [f"{where}.spec.{k}" for k in ("hostNetwork", "hostPID", "hostIPC") if pod.get(k)]
    if pod.get("serviceAccountName") or pod.get("serviceAccount"):
        found.append(f"{where}.spec.serviceAccountName")
    if pod.get("automountServiceAccountToken"):
        found.append(f"{where}.spec.automountServiceAccountToken")
    for i, volume in enumerate(pod.get("volumes") or []):
        if isinstance(volume, Mapping) and "hostPath" in volume:
            found.append(f"{where}.spec.volumes[{i}].hostPath")
    found += _unsafe_context(pod.get("securityContext") or {}, where=f"{where}.spec.securityContext")
    for field in ("initContainers", "containers"):
        for i, container in enumerate(pod.get(field) or []):
            context = (container.get("securityContext") or {}) if isinstance(container, Mapping) else {}
            at = f"{where}.spec.{field}[{i}].securityContext"
            found += [f"{at}.{k}" for k in ("privileged", "allowPrivilegeEscalation") if context.get(k)]
            added = set((context.get("capabilities") or {}).get("add") or []) - ALLOWED_CAPABILITIES
            if added:
                found.append(f"{at}.capabilities.add ({', '.join(sorted(map(str, added)))})")
            found += _unsafe_context(context, where=at)
    return found


def _unsafe_context(context: Mapping[str, Any], *, where: str) -> list[str]:
    found = []
    if context.get("runAsUser") == 0:
        found.append(f"{where}.runAsUser (0)")
    if context.get("runAsNonRoot") is False:
        found.append(f"{where}.runAsNonRoot (false)")
    if (context.get("seccompProfile") or {}).get("type") == "Unconfined":
        found.append(f"{where}.seccompProfile (Unconfined)")
    return found


def check_template(template: Mapping[str, Any], *, where: str, allow_privileged: bool) -> None:
    """Refuses a pod template asking for more than the restricted profile, naming the field,
    unless the submitter allowed it (`job submit --allow-privileged`)."""
    found = unsafe_template_fields(template, where=where)
    if found and not allow_privileged:
        raise JobSpecError(
            f"{found[0]} asks for more than paddlecloud's pods get (the restricted Pod Security "
            "Standard, no service account): remove it, or submit with --allow-privileged "
            "(allow_privileged: true) if the job needs it"
            + (f" (also: {', '.join(found[1:4])})" if len(found) > 1 else "")
        )


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
    """JobSpec fields of paddlecloud's own PaddleJob fields (input, output, epochs...)."""
    values: dict[str, Any] = {}
    if spec.get("input") is not None:
        inputs = spec["input"]
        if not isinstance(inputs, list) or not inputs:
            raise JobSpecError(f"invalid spec.input {spec['input']!r:.40}: give a list of paths, "
                               "globs or URLs, e.g. ['/data/train-*.csv']")
        values["inputs"] = tuple(_string(i, where="spec.input item") for i in inputs)
    if spec.get("output") is not None:
        values["output"] = _string(spec["output"], where="spec.output")
    if spec.get("epochs") is not None:
        values["epochs"] = _integer(spec["epochs"], where="spec.epochs", minimum=1)
    if spec.get("suspend") is not None:
        if not isinstance(spec["suspend"], bool):
            raise JobSpecError(f"invalid spec.suspend {spec['suspend']!r:.40}: true or false")
        values["suspend"] = spec["suspend"]
    if spec.get("restartLimit") is not None:
        values["restart_limit"] = _integer(spec["restartLimit"], where="spec.restartLimit", minimum=0)
    if spec.get("format") is not None:
        values["data_format"] = _string(spec["format"], where="spec.format")
    if spec.get("chunkBytes") is not None:
        values["chunk_bytes"] = chunk_bytes(spec["chunkBytes"], where="spec.chunkBytes")
    if spec.get("securityProfile") is not None:
        values["security_profile"] = _string(spec["securityProfile"], where="spec.securityProfile")
    if spec.get("runAsUser") is not None:
        values["run_as_user"] = _integer(spec["runAsUser"], where="spec.runAsUser", minimum=1)
    if spec.get("dataVolume") is not None:
        volume = _mapping(spec["dataVolume"], where="spec.dataVolume")
        refuse_unknown(volume, DATA_VOLUME_FIELDS, where="spec.dataVolume")
        values["data_volume"] = DataVolume(
            claim=_string(volume.get("claim") or "", where="spec.dataVolume.claim"),
            mount_path=_string(volume.get("mountPath") or "", where="spec.dataVolume.mountPath"))
    return values


def chunk_bytes(value: Any, *, where: str = "--chunk-bytes") -> int:
    """Bytes of a chunk size (`64MiB`, `1GiB`, or an integer); errors name the value."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise JobSpecError(f"invalid {where} {value!r:.40}: use e.g. '64MiB' or a number of bytes")
    try:
        size = parse_size(value)
    except ValueError as error:
        raise JobSpecError(f"{where}: {error}") from None
    if size < 1:
        raise JobSpecError(f"invalid {where} {value!r}: a chunk holds at least 1 byte")
    return size


def mode(spec: JobSpec) -> str:
    """paddle-operator's job mode: PS (pservers), Collective (several trainers), Single."""
    if spec.pservers:
        return "PS"
    return "Collective" if spec.trainers > 1 else "Single"
