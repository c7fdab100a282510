"""Creating, reading and deleting one job's objects: the code `job submit` and the job server share.

`create_job` is the one path from rendered objects (`manifests.submit_objects`) to the
API server: the ConfigMaps, then the master Deployment, then its Service, and the
ConfigMaps owned by the Deployment so deleting it removes the whole job. A name in
use is refused and nothing of a half-created job is left behind. `pod_counts` and
`fetch_master_status` are what `job status` and the job server's `GET /v1/jobs/NAME`
read.

What this does NOT guarantee: atomicity across objects — a create lost between the
Deployment and the Service is repaired by the next try adopting the Service, and a
ConfigMap left by a crash of the caller itself stays (unowned) until deleted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable
from typing import Any

from paddlecloud.jobspec import JobSpec
from paddlecloud.k8s import manifests

logger = logging.getLogger(__name__)

ROLES = (manifests.TRAINER, manifests.PSERVER, manifests.MASTER)
RETRY_ATTEMPTS, RETRY_WAIT = 3, 0.5


class JobCreateError(RuntimeError):
    """The job could not be created (or looked at); the message says why and what to do."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def call(fn: Callable[..., Any], *args: Any, verb: str, resource: str, namespace: str,
         name: str = "", tolerate: Collection[int] = (), rights: str | None = None,
         **kwargs: Any) -> Any:
    """One blocking API call, retried; None for an answer in `tolerate`, any other API
    error a `JobCreateError` naming the call (a bug, not an API answer, as it is)."""
    from paddlecloud.k8s.client import RetryPolicy, api_status, call_sync, explained

    try:
        return call_sync(RetryPolicy(attempts=RETRY_ATTEMPTS, initial_wait=RETRY_WAIT),
                         fn, *args, **kwargs)
    except Exception as error:
        status = api_status(error)
        if status in tolerate:
            return None
        clear = explained(error, verb=verb, resource=resource, namespace=namespace, name=name,
                          rights=rights)
        if clear is error:
            raise
        raise JobCreateError(str(clear), status=status) from None


def to_dict(api: Any, obj: Any) -> dict[str, Any]:
    return obj if isinstance(obj, dict) else api.sanitize_for_serialization(obj)


def create_job(api: Any, *, spec: JobSpec, objects: list[dict[str, Any]],
               rights: str | None = None) -> None:
    """Creates the ConfigMaps, then the Deployment, then its Service; a name in use is refused."""
    from kubernetes import client

    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    ns = spec.namespace
    created: list[str] = []

    def create(fn: Callable[..., Any], body: dict[str, Any], resource: str, *,
               adopt: bool = False) -> Any:
        """The created object; None when it existed and `adopt` says that is fine."""
        name = body["metadata"]["name"]
        made = call(fn, ns, body, verb="create", resource=resource, namespace=ns, name=name,
                    tolerate=(409,), rights=rights)
        if made is None and not adopt:
            raise JobCreateError(
                f"job {spec.name} already exists in namespace {ns} ({resource} {name} exists)",
                status=409)
        return made

    try:
        for cm in (o for o in objects if o["kind"] == "ConfigMap"):
            create(core.create_namespaced_config_map, cm, "configmaps")
            created.append(cm["metadata"]["name"])
        deployment = next(o for o in objects if o["kind"] == "Deployment")
        made = to_dict(api, create(apps.create_namespaced_deployment, deployment, "deployments"))
    except JobCreateError:
        for cm in created:  # leave nothing behind of a job that was not created
            call(core.delete_namespaced_config_map, cm, ns, verb="delete", resource="configmaps",
                 namespace=ns, name=cm, tolerate=(404,), rights=rights)
        raise
    uid = (made.get("metadata") or {}).get("uid")
    if not uid:
        raise JobCreateError(f"the API server gave Deployment {deployment['metadata']['name']} no uid")
    owner = manifests.owner_reference(spec.name, uid)
    create(core.create_namespaced_service, manifests.master_service(spec, owner), "services",
           adopt=True)
    for cm in created:  # owned too, so deleting the Deployment alone removes the whole job
        call(core.patch_namespaced_config_map, cm, ns, {"metadata": {"ownerReferences": [owner]}},
             verb="patch", resource="configmaps", namespace=ns, name=cm, rights=rights,
             _content_type="application/merge-patch+json")


def pod_counts(pods: Iterable[Any], job_name: str) -> dict[str, dict[str, int]]:
    """{role: {phase: count}} of a job's pods."""
    counts: dict[str, dict[str, int]] = {role: {} for role in ROLES}
    for pod in pods:
        labels = pod.metadata.labels or {}
        role = labels.get(manifests.ROLE_LABEL)
        if labels.get(manifests.JOB_LABEL) != job_name or role not in counts:
            continue
        phase = (pod.status.phase if pod.status else None) or manifests.POD_PHASES[0]
        counts[role][phase] = counts[role].get(phase, 0) + 1
    return counts


def fetch_master_status(address: str, *, timeout: float) -> Any:
    """The master's GetStatus answer; raises grpc.RpcError when it cannot be reached."""
    import grpc

    from paddlecloud.api import pb, pb_grpc

    with grpc.insecure_channel(address) as channel:
        return pb_grpc.MasterStub(channel).GetStatus(pb.GetStatusRequest(), timeout=timeout)
