"""`paddlecloud operator`'s Kopf handlers: a thin translator from a PaddleJob to its master.

For each PaddleJob (`paddlejobs.batch.paddlepaddle.org/v1`):

* created (or found at the operator's start): translated by the one translation
  (`paddlecloud.paddlejob`) and given the same objects `paddlecloud job submit`
  creates (`manifests.submit_objects`: the job-spec ConfigMap, the master
  Deployment, its Service), the Deployment and the ConfigMap owned by the
  PaddleJob, so one `kubectl delete pdj NAME` removes the job through the garbage
  collector;
* every `interval` seconds (a timer): the master's phase (its Deployment's
  annotations) and the workloads' counts are mirrored into the PaddleJob's status
  and conditions, with an Event on each phase change and on each role workload the
  master says it created again; a master Deployment deleted by hand while the job
  runs is created again; a hold (spec.suspend, a Kueue eviction) is asked of the
  master, which drains and removes its workloads, and the master is stopped after;
* deleted: the master's objects labelled with the job are deleted explicitly too
  (the garbage collector would, but not at once; it removes the workloads, which
  the master Deployment owns), and the job's etcd keys are cleared, as
  `paddlecloud job delete` does.

One deployer per job: the job's leading master creates, supervises, re-creates and
removes its workloads (the pserver StatefulSet, the trainer Job, heters, the PodGroup),
as it does for `paddlecloud job submit`; this operator creates and owns only the
master and reads the workloads (tests/k8s/test_operator_writes.py pins it). Its Role
still holds the workload verbs, only because the API server lets it create the
master's Role with no right it lacks itself.

Two operators: with peering (Kopf's, `--peering NAME`), the one of the higher
priority acts and the other pauses until it is gone.

What this does NOT guarantee: that the master runs (image, RBAC, etcd are the
cluster's); a spec changed after creation is not applied to a running job (an
Event says so: delete and apply again).
"""

from __future__ import annotations

import datetime
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from paddlecloud.backends.k8s import manifests
from paddlecloud.backends.k8s.client import (
    OPERATOR_MANAGER,
    RetryPolicy,
    api_status,
    applied,
    apply_body,
    call,
    load_api_client,
)
from paddlecloud.backends.k8s.deployer import PODGROUPS, VOLCANO_GROUP, VOLCANO_VERSION
from paddlecloud.jobspec import (
    DEFAULT_ETCD_ENDPOINTS,
    DEFAULT_IMAGE,
    PADDLEJOB_API_VERSION,
    JobSpec,
    JobSpecError,
)
from paddlecloud.paddlejob import PODGROUP_KIND, PODGROUP_SPEC_FIELDS, translate
from paddlecloud.phase import TERMINAL, Phase
from pdj_operator import crd, kueue, trainingjobs
from pdj_operator.status import (
    SUSPEND_MESSAGES,
    Observed,
    conditions,
    eta,
    job_status,
    master_phase,
    refused_status,
    utc_now,
)

logger = logging.getLogger(__name__)

COMPONENT = "paddlecloud-operator"
USER_AGENT = f"{COMPONENT}/1"


@dataclass(frozen=True)
class OperatorConfig:
    """What every PaddleJob gets from the operator, and how often it looks."""

    etcd_endpoints: str = DEFAULT_ETCD_ENDPOINTS
    image: str = DEFAULT_IMAGE
    kubeconfig: str | None = None
    interval: float = 10.0
    clear_etcd: bool = True
    etcd_timeout: float = 5.0

    def __post_init__(self) -> None:
        if self.interval <= 0:
            raise ValueError(f"invalid interval {self.interval!r}: must be > 0 seconds")
        if self.etcd_timeout <= 0:
            raise ValueError(f"invalid etcd timeout {self.etcd_timeout!r}: must be > 0 seconds")


_now = utc_now


# On a PaddleJob: the etcd user made for it (its password is in the Secret NAME-etcd only)
ETCD_USER_ANNOTATION = "paddlecloud.org/etcd-user"
# What the operator records on a PaddleJob: its CA, its etcd user, the master's last word on
# a workload it created again (told as an Event once)
RECORDS = (manifests.MASTER_CA_ANNOTATION, ETCD_USER_ANNOTATION, manifests.RECREATED_ANNOTATION)


def _recorded_etcd_user(body: Mapping[str, Any]) -> str | None:
    return ((body.get("metadata") or {}).get("annotations") or {}).get(ETCD_USER_ANNOTATION)


def _recorded_ca(body: Mapping[str, Any]) -> bytes | None:
    """The job's CA certificate as recorded on the PaddleJob `body`, None before it is."""
    known = ((body.get("metadata") or {}).get("annotations") or {}).get(
        manifests.MASTER_CA_ANNOTATION)
    return str(known).encode("ascii") if known else None


def pdj_owner(body: Mapping[str, Any]) -> dict[str, Any]:
    """An owner reference to the PaddleJob: deleting it deletes the owned object."""
    meta = body["metadata"]
    return {"apiVersion": PADDLEJOB_API_VERSION, "kind": crd.KIND, "name": meta["name"],
            "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}


class JobObjects:
    """The Kubernetes calls of one operator: the job's objects, Events, the master's status.

    The client blocks; every call runs off the event loop, retried as the master's
    deployer retries (`paddlecloud.backends.k8s.client.call`).
    """

    def __init__(self, config: OperatorConfig, *, api_client: Any | None = None) -> None:
        from kubernetes import client

        self.config = config
        self.api = api_client if api_client is not None else load_api_client(config.kubeconfig)
        self.api.user_agent = USER_AGENT  # its requests stand apart in the API server's audit log
        self.core = client.CoreV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.networking = client.NetworkingV1Api(self.api)
        self.rbac = client.RbacAuthorizationV1Api(self.api)
        self.retry = RetryPolicy(attempts=3, initial_wait=0.2)

    def _dict(self, obj: Any) -> dict[str, Any]:
        return obj if isinstance(obj, dict) else self.api.sanitize_for_serialization(obj)

    async def read(self, fn: Any, *args: Any) -> dict[str, Any] | None:
        try:
            return self._dict(await call(self.retry, fn, *args))
        except Exception as error:
            if api_status(error) == 404:
                return None
            raise

    async def _create(self, body: dict[str, Any], *, read: Any, owner_uid: str, patch: Any,
                      create: Any = None, adopt: bool = False) -> tuple[dict[str, Any], bool]:
        """Creates `body` by a server-side apply of the operator's (`patch`), or returns the
        existing object when `owner_uid` owns it; and whether this call created it. Read first:
        an apply would merge into an object of that name that is not this job's. With `create`,
        by a create instead (the master Deployment: two handlers may race to create it, and
        the API server's 409 tells the one that lost; docs/kubernetes.md, "Server-side apply").

        With `adopt`, an existing object of the same job owned by an earlier master
        Deployment (one deleted by hand, not yet collected) is given to the new one: the
        whole object again, its owner now the new master.
        """
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        existing = await self.read(read, name, ns)
        if existing is None:
            try:
                if create is not None:
                    return self._dict(await call(self.retry, create, ns, body,
                                                 field_manager=OPERATOR_MANAGER)), True
                return self._dict(await call(self.retry, patch, name, ns, body,
                                             **applied(OPERATOR_MANAGER))), True
            except Exception as error:
                if api_status(error) != 409:
                    raise
            existing = await self.read(read, name, ns) or {}
        meta = existing.get("metadata") or {}
        owners = {o.get("uid") for o in meta.get("ownerReferences") or []}
        same_job = (meta.get("labels") or {}).get(manifests.JOB_LABEL) == \
            body["metadata"]["labels"][manifests.JOB_LABEL]
        if owner_uid not in owners and adopt and same_job:
            # forced: the operator made it (a create of an earlier version is another manager
            # to its apply) for this job (its label)
            return self._dict(await call(self.retry, patch, name, ns, body,
                                         **applied(OPERATOR_MANAGER, force=True))), False
        if owner_uid not in owners:
            raise kopf.PermanentError(
                f"{body['kind']} {name} already exists in namespace {ns} and is not this "
                "PaddleJob's (a job submitted with `paddlecloud job submit`?): delete it or "
                "rename the PaddleJob")
        return existing, False

    async def ensure_master(self, spec: JobSpec, body: Mapping[str, Any], *, again: bool = False,
                            held: bool = False) -> bool:
        """The objects `paddlecloud job submit` creates, owned by the PaddleJob; whether this
        call created the master Deployment (the caller records an Event for it then).

        `again`: the master Deployment of a job that ran was deleted (the garbage collector
        takes its trainers with it): the new one is marked to restart the epoch at the
        checkpoint before its group, as after a suspend; `held`: it is created stopped."""
        owner = pdj_owner(body)
        ca = await self._ensure_tokens(spec, owner, body)
        await self._ensure_etcd_user(spec, owner, body)
        group = await self.companion_podgroup(body) if spec.uses_volcano else None
        deployment: dict[str, Any] = {}
        created = False
        for obj in manifests.submit_objects(spec):
            if obj["kind"] == "Deployment":
                obj = _marked(manifests.publish_master_ca(obj, ca), again=again, held=held)
                if group is not None:  # the master's deployer adopts it
                    obj["metadata"].setdefault("annotations", {})[
                        manifests.COMPANION_PODGROUP_ANNOTATION] = group["metadata"]["uid"]
            if obj["kind"] == "ConfigMap":
                obj["metadata"]["ownerReferences"] = [owner]
                await self._create(obj, read=self.core.read_namespaced_config_map,
                                   patch=self.core.patch_namespaced_config_map,
                                   owner_uid=owner["uid"])
            elif obj["kind"] == "Deployment":
                obj["metadata"]["ownerReferences"] = [owner]
                deployment, created = await self._create(
                    obj, read=self.apps.read_namespaced_deployment,
                    patch=self.apps.patch_namespaced_deployment,
                    create=self.apps.create_namespaced_deployment, owner_uid=owner["uid"])
        uid = (deployment.get("metadata") or {}).get("uid")
        if not uid:
            raise kopf.TemporaryError(f"Deployment {manifests.master_name(spec.name)} has no uid yet",
                                      delay=1)
        service = manifests.master_service(spec, manifests.owner_reference(spec.name, uid))
        await self._create(service, read=self.core.read_namespaced_service, owner_uid=uid,
                           patch=self.core.patch_namespaced_service, adopt=True)
        rbac = {"ServiceAccount": (self.core.read_namespaced_service_account,
                                   self.core.patch_namespaced_service_account),
                "Role": (self.rbac.read_namespaced_role, self.rbac.patch_namespaced_role),
                "RoleBinding": (self.rbac.read_namespaced_role_binding,
                                self.rbac.patch_namespaced_role_binding)}
        for obj in manifests.master_rbac(spec, manifests.owner_reference(spec.name, uid)):
            read, patch = rbac[obj["kind"]]
            await self._create(obj, read=read, owner_uid=uid, patch=patch, adopt=True)
        for policy in manifests.network_policies(spec, manifests.owner_reference(spec.name, uid)):
            await self._create(policy, read=self.networking.read_namespaced_network_policy,
                               owner_uid=uid, patch=self.networking.patch_namespaced_network_policy,
                               adopt=True)
        return created

    async def _ensure_tokens(self, spec: JobSpec, owner: Mapping[str, Any],
                             body: Mapping[str, Any]) -> bytes:
        """The job's Secret (its tokens, the master's TLS certificate and key; its master pods
        mount it), owned by the PaddleJob so a re-created master keeps the tokens its trainers
        hold. Made once, never read (the operator may create Secrets, not read them): the CA
        that signed its certificate is recorded on the PaddleJob (annotation, public) once the
        Secret exists, and read back from there. Returns the job's CA certificate."""
        from paddlecloud.auth import JobTokens
        from paddlecloud.tls import issue_master_certificate

        if known := _recorded_ca(body):
            return known
        hosts = manifests.master_certificate_hosts(spec.name, spec.namespace)
        certificate = issue_master_certificate(hosts, job=spec.name)
        secret = manifests.tokens_secret(spec, JobTokens.generate().as_mapping(), owner,
                                         certificate=certificate)
        if known := await self._create_once(spec, secret, recorded=_recorded_ca, what="CA",
                                            annotation=manifests.MASTER_CA_ANNOTATION):
            return known
        await self.record(spec, manifests.MASTER_CA_ANNOTATION, certificate.ca.decode("ascii"))
        return certificate.ca

    async def _ensure_etcd_user(self, spec: JobSpec, owner: Mapping[str, Any],
                                body: Mapping[str, Any]) -> None:
        """The job's own etcd user (`paddlecloud.etcd_users`) and its Secret, owned by the
        PaddleJob; made once, then recorded on the PaddleJob (ETCD_USER_ANNOTATION). The
        operator may not replace a Secret: one left by a try cut short before that record
        holds a stale password, and the error says to delete it. Called after
        `_ensure_tokens`, which refuses a name whose tokens are not this PaddleJob's (a job
        of `job submit`), so a running job's etcd user never gets a new password here."""
        from paddlecloud.etcd_users import provision_job_user

        if _recorded_etcd_user(body):
            return
        user = await provision_job_user(spec.etcd_endpoints, namespace=spec.namespace,
                                        job=spec.name, timeout=self.config.etcd_timeout)
        if user is None:  # this operator logs in to etcd as nobody: etcd runs without auth
            return
        secret = manifests.etcd_user_secret(spec, user=user.name, password=user.password,
                                            owner=owner)
        if not await self._create_once(spec, secret, recorded=_recorded_etcd_user,
                                       what="etcd user", annotation=ETCD_USER_ANNOTATION):
            await self.record(spec, ETCD_USER_ANNOTATION, user.name)

    async def _create_once(self, spec: JobSpec, secret: dict[str, Any], *,
                           recorded: Callable[[Mapping[str, Any]], Any], what: str,
                           annotation: str) -> Any:
        """Creates one of the job's Secrets the operator makes once and never reads: None once
        created; on 409, what the PaddleJob as stored now records for it (`recorded`: a
        handler run on a body older than our own annotation patch, which Kopf may hand over
        again); else the Secret is not ours to trust, and the error says to delete it."""
        try:
            await call(self.retry, self.core.create_namespaced_secret, spec.namespace, secret)
            return None
        except Exception as error:
            if api_status(error) != 409:
                raise
        stored = await self.read(self.custom.get_namespaced_custom_object, crd.GROUP,
                                 crd.VERSION, spec.namespace, crd.PLURAL, spec.name)
        if known := recorded(stored or {}):
            return known
        raise kopf.PermanentError(
            f"Secret {secret['metadata']['name']} exists but PaddleJob {spec.name} records no "
            f"{what} for it ({annotation}): delete that Secret and the operator makes a new one")

    async def record(self, spec: JobSpec, annotation: str, value: str) -> None:
        """Records `annotation: value` on the PaddleJob (public: no secret goes there), with
        the other records it holds: an apply states every field its manager keeps (one left
        out would be removed)."""
        stored = await self.read(self.custom.get_namespaced_custom_object, crd.GROUP,
                                 crd.VERSION, spec.namespace, crd.PLURAL, spec.name)
        held = ((stored or {}).get("metadata") or {}).get("annotations") or {}
        records = {key: held[key] for key in RECORDS if key in held}
        records[annotation] = value
        await call(self.retry, self.custom.patch_namespaced_custom_object, crd.GROUP, crd.VERSION,
                   spec.namespace, crd.PLURAL, spec.name,
                   apply_body({"metadata": {"annotations": records}},
                              api_version=PADDLEJOB_API_VERSION, kind=crd.KIND, name=spec.name,
                              namespace=spec.namespace),
                   **applied(OPERATOR_MANAGER))

    async def companion_podgroup(self, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """The Volcano PodGroup `kubectl apply` created from the PaddleJob's own file: named
        like the job, in its namespace, labelled for no job yet. As the document the file
        held (the spec fields a PaddleJob file may give, and its uid: the master Deployment
        records it for its deployer, which adopts that PodGroup), None when there is none."""
        meta = body["metadata"]
        stored = await self.read(self.custom.get_namespaced_custom_object, VOLCANO_GROUP,
                                 VOLCANO_VERSION, meta["namespace"], PODGROUPS, meta["name"])
        labels = ((stored or {}).get("metadata") or {}).get("labels") or {}
        if stored is None or manifests.JOB_LABEL in labels:
            return None  # none, or the job's own (its master made it, or we adopted it)
        given = {k: v for k, v in (stored.get("spec") or {}).items() if k in PODGROUP_SPEC_FIELDS}
        return {"apiVersion": manifests.VOLCANO_API_VERSION, "kind": PODGROUP_KIND,
                "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                             "uid": stored["metadata"].get("uid")}, "spec": given}

    # ---- holding a job: spec.suspend and Kueue ---------------------------------------------
    async def hold_reason(self, spec: JobSpec, body: Mapping[str, Any]) -> tuple[str, Any]:
        """Why the job may not run now ("" when it may), and its Kueue Workload (None when not
        queued): spec.suspend first, then Kueue's admission."""
        wl = await self.ensure_workload(spec, body) if spec.local_queue else None
        if spec.suspend:
            return "SuspendedBySpec", wl
        return (kueue.hold_reason(wl) if wl is not None else ""), wl

    async def ensure_workload(self, spec: JobSpec, body: Mapping[str, Any]) -> dict[str, Any]:
        """The queued job's Kueue Workload, created the first time."""
        args = (kueue.KUEUE_GROUP, kueue.KUEUE_VERSION, spec.namespace, kueue.WORKLOADS)
        name = kueue.workload_name(spec.name)
        existing = await self.read(self.custom.get_namespaced_custom_object, *args, name)
        if existing is not None:
            return existing
        wl, _ = await self._create(
            kueue.workload(spec, pdj_owner(body)),
            read=lambda n, ns, **kw: self.custom.get_namespaced_custom_object(*args[:2], ns, args[3], n, **kw),
            patch=lambda n, ns, obj, **kw: self.custom.patch_namespaced_custom_object(
                *args[:2], ns, args[3], n, obj, **kw),
            owner_uid=body["metadata"]["uid"])
        return wl

    async def release_workload(self, wl: Mapping[str, Any]) -> None:
        """Gives the evicted Workload's quota back once the job stopped: Kueue queues it again.
        A merge patch (naming our field manager), not an apply: it removes the admission,
        a field Kueue owns, which an apply cannot remove."""
        meta = wl["metadata"]
        await call(self.retry, self.custom.patch_namespaced_custom_object_status,
                   kueue.KUEUE_GROUP, kueue.KUEUE_VERSION, meta["namespace"], kueue.WORKLOADS,
                   meta["name"], kueue.released_status(wl, now=_now()),
                   _content_type="application/merge-patch+json", field_manager=OPERATOR_MANAGER)

    async def control_master(self, spec: JobSpec, *, running: bool, suspend: bool) -> None:
        """What the operator asks of the job's master on its Deployment: run (its replicas)
        or not, and whether to suspend (`manifests.SUSPEND_ANNOTATION`: the master drains its
        trainers and removes its own workloads, the operator never does). A master stopped
        or asked to suspend is marked to restart the epoch at the checkpoint when it deploys
        again (`manifests.RESUME_ANNOTATION`, read by its deployer)."""
        replicas = manifests.master_deployment(spec)["spec"]["replicas"] if running else 0
        name = manifests.master_name(spec.name)
        # forced: the operator owns the master's replicas (it created the Deployment), the
        # suspend request and the resume mark (the master takes that one over when it is
        # done: RESUME_DONE); one apply states all three, as server-side apply wants
        body = apply_body({"spec": {"replicas": replicas},
                           "metadata": {"annotations": {
                               manifests.RESUME_ANNOTATION: manifests.RESUME_PENDING,
                               manifests.SUSPEND_ANNOTATION: str(suspend).lower()}}},
                          api_version="apps/v1", kind="Deployment", name=name,
                          namespace=spec.namespace)
        await call(self.retry, self.apps.patch_namespaced_deployment, name, spec.namespace, body,
                   **applied(OPERATOR_MANAGER, force=True))

    async def deployment(self, spec: JobSpec) -> dict[str, Any] | None:
        return await self.read(self.apps.read_namespaced_deployment,
                               manifests.master_name(spec.name), spec.namespace)

    async def workloads(self, spec: JobSpec) -> dict[str, dict[str, Any] | None]:
        out: dict[str, dict[str, Any] | None] = {}
        for role in spec.roles:
            name = manifests.role_name(spec.name, role)
            if role == manifests.TRAINER:
                out[role] = await self.read(self.batch.read_namespaced_job, name, spec.namespace)
            else:
                out[role] = await self.read(self.apps.read_namespaced_stateful_set, name,
                                            spec.namespace)
        return out

    async def delete_all(self, spec: JobSpec) -> list[str]:
        """Deletes the objects labelled with the job that the operator made or may delete (the
        master first); returns what went. The role workloads (StatefulSets, the trainer Job,
        the PodGroup) are the master's: owned by its Deployment, the garbage collector removes
        them with it."""
        from kubernetes import client

        options = client.V1DeleteOptions(propagation_policy="Background")
        ns, selector = spec.namespace, manifests.label_selector(spec.name)
        kinds = [
            ("deployments", self.apps.list_namespaced_deployment, self.apps.delete_namespaced_deployment),
            ("services", self.core.list_namespaced_service, self.core.delete_namespaced_service),
            ("configmaps", self.core.list_namespaced_config_map,
             self.core.delete_namespaced_config_map),
            ("networkpolicies", self.networking.list_namespaced_network_policy,
             self.networking.delete_namespaced_network_policy),
        ]
        deleted = []
        for resource, list_fn, delete_fn in kinds:
            listed = self._dict(await call(self.retry, list_fn, ns, label_selector=selector))
            for item in listed.get("items") or []:
                name = item["metadata"]["name"]
                try:
                    await call(self.retry, delete_fn, name, ns, body=options)
                    deleted.append(f"{resource}/{name}")
                except Exception as error:
                    if api_status(error) != 404:
                        raise
        return deleted

    async def event(self, body: Mapping[str, Any], *, kind: str, reason: str, message: str) -> None:
        """Records a Kubernetes Event on the PaddleJob, or TrainingJob, `body` (`kubectl describe`
        shows it)."""
        meta = body["metadata"]
        now = _now()
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}",
                         "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": body.get("apiVersion") or PADDLEJOB_API_VERSION,
                               "kind": body.get("kind") or crd.KIND,
                               "name": meta["name"], "namespace": meta["namespace"],
                               "uid": meta.get("uid")},
            "type": kind, "reason": reason, "message": message[:1024],
            "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            await call(self.retry, self.core.create_namespaced_event, meta["namespace"], event)
        except Exception as error:  # an Event is a courtesy: never fail a handler for one
            logger.warning("could not record event %s on %s: %s", reason, meta["name"], error)

    async def clear_etcd(self, spec: JobSpec) -> int:
        """Deletes the job's keys under /paddlecloud/NS/NAME/ and its etcd user, as
        `paddlecloud job delete` does."""
        from paddlecloud.etcd_users import forget_job

        return await forget_job(spec.etcd_endpoints, namespace=spec.namespace, job=spec.name,
                                timeout=self.config.etcd_timeout)


def spec_of(body: Mapping[str, Any], config: OperatorConfig, *,
            podgroup: Mapping[str, Any] | None = None) -> JobSpec:
    """The one translation, with what the operator gives every job."""
    return translate(body, podgroup=podgroup, etcd_endpoints=config.etcd_endpoints,
                     image=config.image, paddlecloud_image=config.image).validate()


TIMER_EXIT_POLL = 1.0  # seconds between Kopf's looks at a deleted job's timer still running


def make_settings() -> kopf.OperatorSettings:
    """Kopf's settings for this operator (`kopf.run(settings=)`).

    Scanning is off: the operator serves the namespaces it is given (which must
    exist) or all of them, and the PaddleJob CRD must be installed before it starts
    (Kopf would otherwise list namespaces and CRDs all the time, and need the
    rights to).
    """
    settings = kopf.OperatorSettings()
    settings.scanning.disabled = True
    settings.posting.enabled = False  # our own Events, named and worded for the job
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="paddlecloud.org")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="paddlecloud.org")
    settings.watching.server_timeout = 60
    # A job deleted while one of its timers runs keeps its finalizer until the timer is out:
    # Kopf looks again after this many seconds (its default, a minute, is a minute more the
    # object lingers deleting; a timer's run is an API read or two)
    settings.background.cancellation_polling = TIMER_EXIT_POLL
    return settings


def make_registry(config: OperatorConfig, *,
                  objects: JobObjects | None = None) -> kopf.OperatorRegistry:
    """The operator's handlers, registered on a registry of their own (`kopf.run(registry=)`)."""
    registry = kopf.OperatorRegistry()
    resource = (crd.GROUP, crd.VERSION, crd.PLURAL)
    state: dict[str, JobObjects] = {}

    def jobs() -> JobObjects:
        if "objects" not in state:
            state["objects"] = objects if objects is not None else JobObjects(config)
        return state["objects"]

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        conf = load_api_client(config.kubeconfig).configuration
        header = conf.get_api_key_with_prefix("BearerToken") or conf.get_api_key_with_prefix(
            "authorization")
        scheme, _sep, token = (header or "").rpartition(" ")
        return kopf.ConnectionInfo(
            server=conf.host, ca_path=conf.ssl_ca_cert, insecure=not conf.verify_ssl,
            scheme=scheme or ("Bearer" if token else None), token=token or None,
            certificate_path=conf.cert_file, private_key_path=conf.key_file)

    @kopf.on.resume(*resource, registry=registry)
    @kopf.on.create(*resource, registry=registry)
    async def apply(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        try:
            spec = spec_of(body, config)
            # a PodGroup document applied with the job (kubectl apply -f of one file) is
            # the job's: its queue, priority and minMember (checked) are kept, and the
            # master's deployer adopts it (`ensure_master` records which one)
            group = await jobs().companion_podgroup(body) if spec.uses_volcano else None
            if group is not None:
                spec = spec_of(body, config, podgroup=group)
        except JobSpecError as error:
            patch.status.update(refused_status("InvalidSpec", str(error), now=_now(),
                                               generation=_generation(body)))
            await jobs().event(body, kind="Warning", reason="InvalidSpec", message=str(error))
            raise kopf.PermanentError(str(error)) from None
        hold, wl = await jobs().hold_reason(spec, body)
        if hold:  # held before it ever ran: the master is created once it may run (`observe`)
            _show_held(patch, spec, body, hold)
            return
        await _start(spec.replace(trainers=kueue.admitted_trainers(wl, spec)), body, patch, jobs())

    @kopf.on.update(*resource, field="spec", registry=registry)
    async def changed(body: kopf.Body, old: Any, new: Any, **_: Any) -> None:
        before, after = dict(old or {}), dict(new or {})
        if before.pop("suspend", False) != after.pop("suspend", False):
            await _suspend_changed(body, suspend=bool((new or {}).get("suspend")), jobs=jobs())
        if before != after:
            await jobs().event(body, kind="Warning", reason="SpecChanged", message=(
                "a PaddleJob's spec is read when the job starts (spec.suspend apart): the "
                "running job keeps its spec; delete the PaddleJob and apply it again to run the "
                "new one"))

    @kopf.timer(*resource, interval=config.interval, registry=registry)
    async def observe(body: kopf.Body, status: kopf.Status, patch: kopf.Patch, **_: Any) -> None:
        try:
            spec = spec_of(body, config)
        except JobSpecError:
            return  # `apply` reported it
        old_phase = status.get("phase")
        if old_phase in {p.value for p in TERMINAL} and not status.get("master"):
            return  # an invalid spec (`apply` reported it)
        hold, wl = await jobs().hold_reason(spec, body)
        if not status.get("master"):
            if old_phase != SUSPENDED:
                return  # `apply` has not created the master yet
            if hold:  # held since its creation
                _show_held(patch, spec, body, hold)
            else:
                await _start(spec.replace(trainers=kueue.admitted_trainers(wl, spec)), body,
                             patch, jobs())
            return
        deployment = await jobs().deployment(spec)
        if deployment is not None and master_phase(deployment) not in {p.value for p in TERMINAL}:
            await _hold_or_resume(spec, body=body, hold=hold, wl=wl, deployment=deployment,
                                  jobs=jobs())
            deployment = await jobs().deployment(spec)
        if deployment is None:
            if old_phase not in {p.value for p in TERMINAL} and \
                    await jobs().ensure_master(spec, body, again=True, held=bool(hold)):
                await jobs().event(body, kind="Warning", reason="MasterRecreated", message=(
                    f"master Deployment {manifests.master_name(spec.name)} was deleted while the "
                    "job ran: created again (it resumes from etcd)"))
            return
        workloads = await jobs().workloads(spec)
        new = job_status(spec, deployment=deployment, workloads=workloads)
        restarting = _annotation(deployment, manifests.RESTARTING_ANNOTATION)
        over = new["phase"] in {p.value for p in TERMINAL}
        await _tell_recreated(spec, body, deployment, jobs=jobs())
        now = _now()
        new["conditions"] = conditions(
            Observed(phase=new["phase"], generation=_generation(body), suspended=hold,
                     restarting=restarting, message=_annotation(deployment,
                                                                manifests.PHASE_REASON_ANNOTATION)),
            now=now, previous=status.get("conditions"))
        if hold and not over:
            new["phase"] = SUSPENDED
        new["observedGeneration"] = _generation(body)
        if new["phase"] == Phase.RUNNING and not status.get("startTime"):
            new["startTime"] = now
        if over and not status.get("completionTime"):
            new["completionTime"] = now
        new["eta"] = None if over else eta(new.get("percentDone"),
                                           running_for=_seconds_since(status.get("startTime")))
        patch.status.update(new)
        if new["phase"] != old_phase:
            await jobs().event(body, kind="Warning" if new["phase"] == Phase.FAILED else "Normal",
                               reason=new["phase"],
                               message=f"job phase {old_phase or 'none'} -> {new['phase']}")

    @kopf.on.delete(*resource, registry=registry)
    async def delete(body: kopf.Body, **_: Any) -> None:
        try:
            spec = spec_of(body, config)
        except JobSpecError:
            return  # nothing was created for it
        deleted = await jobs().delete_all(spec)
        logger.info("PaddleJob %s/%s deleted: %s", spec.namespace, spec.name, ", ".join(deleted))
        if config.clear_etcd:
            try:
                count = await jobs().clear_etcd(spec)
                logger.info("cleared %d etcd keys of %s/%s", count, spec.namespace, spec.name)
            except Exception as error:  # etcd down: the keys stay; `job delete` can clear them
                logger.warning("could not clear the etcd keys of %s/%s: %s (run `paddlecloud job "
                               "delete %s -n %s` later)", spec.namespace, spec.name, error,
                               spec.name, spec.namespace)

    # EDL's TrainingJobs: each converted into the PaddleJob that runs it, which the handlers
    # above run (see pdj_operator.trainingjobs)
    trainingjobs.register(registry, jobs=jobs, check=lambda doc: spec_of(doc, config),
                          interval=config.interval)
    return registry


SUSPENDED = "Suspended"  # the PaddleJob's phase while it is held (the master's phases apart)


def _marked(deployment: dict[str, Any], *, again: bool, held: bool) -> dict[str, Any]:
    """The master Deployment to create: marked to resume at the checkpoint when it is created
    `again`, with no replicas while the job is `held`."""
    if again or held:
        deployment["metadata"].setdefault("annotations", {})[manifests.RESUME_ANNOTATION] = \
            manifests.RESUME_PENDING
    if held:
        deployment["spec"]["replicas"] = 0
    return deployment


async def _suspend_changed(body: Mapping[str, Any], *, suspend: bool, jobs: JobObjects) -> None:
    """spec.suspend flipped: acted on by `observe`; refused (an Event says why) once the job
    ended, as suspending a finished batch Job does nothing."""
    phase = (body.get("status") or {}).get("phase")
    if phase in {p.value for p in TERMINAL}:
        await jobs.event(body, kind="Warning", reason="SuspendRefused", message=(
            f"spec.suspend={str(suspend).lower()} on a job that already ended ({phase}): "
            "nothing to suspend or resume; delete the PaddleJob and apply it again to rerun it"))
        return
    await jobs.event(body, kind="Normal", reason="SuspendRequested" if suspend else "ResumeRequested",
                     message=f"spec.suspend={str(suspend).lower()}: acted on within the status "
                             "interval")


def _generation(body: Mapping[str, Any]) -> int:
    return int((body.get("metadata") or {}).get("generation") or 0)


def _annotation(deployment: Mapping[str, Any] | None, key: str) -> str:
    return str((((deployment or {}).get("metadata") or {}).get("annotations") or {}).get(key)
               or "")


def _seconds_since(timestamp: str | None) -> float:
    """Seconds since a status timestamp the operator wrote; 0 when there is none (or it is not
    one of ours: no ETA then)."""
    try:
        then = datetime.datetime.strptime(timestamp or "", "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=datetime.timezone.utc)
    except ValueError:
        return 0.0
    return (datetime.datetime.now(tz=datetime.timezone.utc) - then).total_seconds()


def _show_held(patch: kopf.Patch, spec: JobSpec, body: Mapping[str, Any], hold: str) -> None:
    """The status of a job held before it ever ran: Suspended, no master yet."""
    status = body.get("status") or {}
    patch.status.update({
        **job_status(spec, deployment=None, workloads={}),
        "master": None, "phase": SUSPENDED, "observedGeneration": _generation(body),
        "conditions": conditions(Observed(phase=Phase.PENDING.value,
                                          generation=_generation(body), suspended=hold,
                                          created="Held"),
                                 now=_now(), previous=status.get("conditions")),
    })


async def _start(spec: JobSpec, body: Mapping[str, Any], patch: kopf.Patch,
                 jobs: JobObjects) -> None:
    """Creates the job's master (which deploys the rest) and shows it Pending."""
    if await jobs.ensure_master(spec, body):
        await jobs.event(body, kind="Normal", reason="Created",
                         message=f"master Deployment {manifests.master_name(spec.name)} created")
    status = body.get("status") or {}
    phase = status.get("phase") if status.get("phase") != SUSPENDED else None
    patch.status.update({  # the conditions are the timer's (`observe`): it reads them fresh
        **job_status(spec, deployment=None, workloads={}),
        "phase": phase or Phase.PENDING.value,
        "observedGeneration": _generation(body),
    })


async def _hold_or_resume(spec: JobSpec, *, body: Mapping[str, Any], hold: str, wl: Any,
                          deployment: Mapping[str, Any], jobs: JobObjects) -> None:
    """A running job that must be held is asked to suspend: its master drains the trainers and
    removes its workloads (the operator writes none), says so, and is then stopped (no failure
    counted) and an evicted Workload's quota given back; a held one that may run again gets
    its master back, which restarts the epoch at the checkpoint and deploys the rest.

    What this does NOT guarantee: a suspend while no master leads completes only once one
    does (the master Deployment's pods are the cluster's to schedule)."""
    replicas = int((deployment.get("spec") or {}).get("replicas") or 0)
    asked = _annotation(deployment, manifests.SUSPEND_ANNOTATION) == "true"
    why = SUSPEND_MESSAGES.get(hold, hold)
    if hold and replicas > 0 and not asked:
        await jobs.control_master(spec, running=True, suspend=True)
        await jobs.event(body, kind="Normal", reason="Suspending", message=(
            f"{why}: the master drains its trainers and removes its workloads"))
    elif hold and replicas > 0 and _annotation(deployment, manifests.SUSPENDED_ANNOTATION) == "true":
        await jobs.control_master(spec, running=False, suspend=True)
        await jobs.event(body, kind="Normal", reason="Suspended", message=(
            f"{why}: the master drained its trainers and removed its workloads, then was "
            "stopped; it resumes at its checkpoint"))
        if hold == "EvictedByKueue" and wl is not None:
            await jobs.release_workload(wl)
    elif not hold and (replicas == 0 or asked):
        await jobs.control_master(spec, running=True, suspend=False)
        if replicas == 0:
            await jobs.event(body, kind="Normal", reason="Resumed",
                             message="master started again: it resumes the job at its checkpoint")


async def _tell_recreated(spec: JobSpec, body: Mapping[str, Any], deployment: Mapping[str, Any],
                          *, jobs: JobObjects) -> None:
    """A WorkloadRecreated Event when the master says it created a role workload again: its
    RECREATED_ANNOTATION moved past the one last told (recorded on the PaddleJob)."""
    said = _annotation(deployment, manifests.RECREATED_ANNOTATION)
    told = ((body.get("metadata") or {}).get("annotations") or {}).get(
        manifests.RECREATED_ANNOTATION)
    if said and said != told:
        await jobs.event(body, kind="Warning", reason="WorkloadRecreated",
                         message=said.partition(": ")[2] or said)
        await jobs.record(spec, manifests.RECREATED_ANNOTATION, said)
