"""`paddlecloud operator`'s Kopf handlers: a thin translator from a PaddleJob to its master.

For each PaddleJob (`paddlejobs.batch.paddlepaddle.org/v1`):

* created (or found at the operator's start): translated by the one translation
  (`paddlecloud.paddlejob`) and given the same objects `paddlecloud job submit`
  creates (`manifests.submit_objects`: the job-spec ConfigMap, the master
  Deployment, its Service), the Deployment and the ConfigMap owned by the
  PaddleJob, so one `kubectl delete pdj NAME` removes the job through the garbage
  collector; the master stays the deployer of the pservers and trainers;
* every `interval` seconds (a timer): the master's phase (its Deployment's
  annotation) and the workloads' counts, and the epochs from the master's
  GetStatus when it answers, are mirrored into the PaddleJob's status and
  conditions, with an Event on each phase change; a master Deployment or a role
  workload deleted by hand while the job runs is created again (the workloads by
  the master's own deployer code, `paddlecloud.k8s.deployer.KubernetesDeployer`);
* deleted: everything labelled with the job is deleted explicitly too (the
  garbage collector would, but not at once), and the job's etcd keys are cleared,
  as `paddlecloud job delete` does.

Two operators: with peering (Kopf's, `--peering NAME`), the one of the higher
priority acts and the other pauses until it is gone.

What this does NOT guarantee: that the master runs (image, RBAC, etcd are the
cluster's); a spec changed after creation is not applied to a running job (an
Event says so: delete and apply again).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from paddlecloud.jobspec import (
    DEFAULT_ETCD_ENDPOINTS,
    DEFAULT_IMAGE,
    PADDLEJOB_API_VERSION,
    JobSpec,
    JobSpecError,
)
from paddlecloud.k8s import manifests
from paddlecloud.k8s.client import RetryPolicy, api_status, call, load_api_client
from paddlecloud.k8s.deployer import PODGROUPS, VOLCANO_GROUP, VOLCANO_VERSION, KubernetesDeployer
from paddlecloud.paddlejob import PODGROUP_KIND, PODGROUP_SPEC_FIELDS, translate
from paddlecloud.phase import TERMINAL, Phase
from pdj_operator import crd, trainingjobs
from pdj_operator.status import conditions, job_status, refused_status, utc_now

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
    deployer retries (`paddlecloud.k8s.client.call`).
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

    async def _create(self, fn: Any, body: dict[str, Any], *, read: Any, owner_uid: str,
                      patch: Any = None) -> tuple[dict[str, Any], bool]:
        """Creates `body`, or returns the existing object when `owner_uid` owns it; and whether
        this call created it (two handlers may race to create the same object: one wins).

        With `patch`, an existing object of the same job owned by an earlier master
        Deployment (one deleted by hand, not yet collected) is given to the new one.
        """
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            return self._dict(await call(self.retry, fn, ns, body)), True
        except Exception as error:
            if api_status(error) != 409:
                raise
        existing = await self.read(read, name, ns) or {}
        meta = existing.get("metadata") or {}
        owners = {o.get("uid") for o in meta.get("ownerReferences") or []}
        same_job = (meta.get("labels") or {}).get(manifests.JOB_LABEL) == \
            body["metadata"]["labels"][manifests.JOB_LABEL]
        if owner_uid not in owners and patch is not None and same_job:
            ours = {"metadata": {"ownerReferences": body["metadata"]["ownerReferences"]}}
            return self._dict(await call(self.retry, patch, name, ns, ours,
                                         _content_type="application/merge-patch+json")), False
        if owner_uid not in owners:
            raise kopf.PermanentError(
                f"{body['kind']} {name} already exists in namespace {ns} and is not this "
                "PaddleJob's (a job submitted with `paddlecloud job submit`?): delete it or "
                "rename the PaddleJob")
        return existing, False

    async def ensure_master(self, spec: JobSpec, body: Mapping[str, Any]) -> bool:
        """The objects `paddlecloud job submit` creates, owned by the PaddleJob; whether this
        call created the master Deployment (the caller records an Event for it then)."""
        owner = pdj_owner(body)
        ca = await self._ensure_tokens(spec, owner, body)
        deployment: dict[str, Any] = {}
        created = False
        for obj in manifests.submit_objects(spec):
            if obj["kind"] == "Deployment":
                obj = manifests.publish_master_ca(obj, ca)
            if obj["kind"] == "ConfigMap":
                obj["metadata"]["ownerReferences"] = [owner]
                await self._create(self.core.create_namespaced_config_map, obj,
                                   read=self.core.read_namespaced_config_map, owner_uid=owner["uid"])
            elif obj["kind"] == "Deployment":
                obj["metadata"]["ownerReferences"] = [owner]
                deployment, created = await self._create(self.apps.create_namespaced_deployment, obj,
                                                read=self.apps.read_namespaced_deployment,
                                                owner_uid=owner["uid"])
        uid = (deployment.get("metadata") or {}).get("uid")
        if not uid:
            raise kopf.TemporaryError(f"Deployment {manifests.master_name(spec.name)} has no uid yet",
                                      delay=1)
        service = manifests.master_service(spec, manifests.owner_reference(spec.name, uid))
        await self._create(self.core.create_namespaced_service, service,
                           read=self.core.read_namespaced_service, owner_uid=uid,
                           patch=self.core.patch_namespaced_service)
        rbac = {"ServiceAccount": (self.core.create_namespaced_service_account,
                                   self.core.read_namespaced_service_account,
                                   self.core.patch_namespaced_service_account),
                "Role": (self.rbac.create_namespaced_role, self.rbac.read_namespaced_role,
                         self.rbac.patch_namespaced_role),
                "RoleBinding": (self.rbac.create_namespaced_role_binding,
                                self.rbac.read_namespaced_role_binding,
                                self.rbac.patch_namespaced_role_binding)}
        for obj in manifests.master_rbac(spec, manifests.owner_reference(spec.name, uid)):
            create, read, patch = rbac[obj["kind"]]
            await self._create(create, obj, read=read, owner_uid=uid, patch=patch)
        for policy in manifests.network_policies(spec, manifests.owner_reference(spec.name, uid)):
            await self._create(self.networking.create_namespaced_network_policy, policy,
                               read=self.networking.read_namespaced_network_policy, owner_uid=uid,
                               patch=self.networking.patch_namespaced_network_policy)
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
        try:
            await call(self.retry, self.core.create_namespaced_secret, spec.namespace, secret)
        except Exception as error:
            if api_status(error) != 409:
                raise
            # a handler run on a body older than our own annotation patch (Kopf may hand one
            # over again): the PaddleJob as stored now says whether the Secret is ours
            stored = await self.read(self.custom.get_namespaced_custom_object, crd.GROUP,
                                     crd.VERSION, spec.namespace, crd.PLURAL, spec.name)
            if known := _recorded_ca(stored or {}):
                return known
            raise kopf.PermanentError(
                f"Secret {secret['metadata']['name']} exists but PaddleJob {spec.name} records no "
                f"CA for it ({manifests.MASTER_CA_ANNOTATION}): delete that Secret and the "
                "operator makes a new one") from None
        await call(self.retry, self.custom.patch_namespaced_custom_object, crd.GROUP, crd.VERSION,
                   spec.namespace, crd.PLURAL, spec.name,
                   {"metadata": {"annotations": {
                       manifests.MASTER_CA_ANNOTATION: certificate.ca.decode("ascii")}}},
                   _content_type="application/merge-patch+json")
        return certificate.ca

    async def companion_podgroup(self, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """The Volcano PodGroup `kubectl apply` created from the PaddleJob's own file: named
        like the job, in its namespace, labelled for no job yet. As the document the file
        held (the spec fields a PaddleJob file may give), None when there is none."""
        meta = body["metadata"]
        stored = await self.read(self.custom.get_namespaced_custom_object, VOLCANO_GROUP,
                                 VOLCANO_VERSION, meta["namespace"], PODGROUPS, meta["name"])
        labels = ((stored or {}).get("metadata") or {}).get("labels") or {}
        if stored is None or manifests.JOB_LABEL in labels:
            return None  # none, or the job's own (its master made it, or we adopted it)
        given = {k: v for k, v in (stored.get("spec") or {}).items() if k in PODGROUP_SPEC_FIELDS}
        return {"apiVersion": manifests.VOLCANO_API_VERSION, "kind": PODGROUP_KIND,
                "metadata": {"name": meta["name"], "namespace": meta["namespace"]}, "spec": given}

    async def adopt_podgroup(self, body: Mapping[str, Any]) -> None:
        """Labels the companion PodGroup as the job's, owned by the PaddleJob: the master's
        deployer then adopts it (and sets its minMember as it deploys), and deleting the
        PaddleJob deletes it."""
        meta = body["metadata"]
        await call(self.retry, self.custom.patch_namespaced_custom_object, VOLCANO_GROUP,
                   VOLCANO_VERSION, meta["namespace"], PODGROUPS, meta["name"],
                   {"metadata": {"labels": {manifests.JOB_LABEL: meta["name"]},
                                 "ownerReferences": [pdj_owner(body)]}},
                   _content_type="application/merge-patch+json")

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
        """Deletes every object labelled with the job (the master first); returns what went."""
        from kubernetes import client

        options = client.V1DeleteOptions(propagation_policy="Background")
        ns, selector = spec.namespace, manifests.label_selector(spec.name)
        kinds = [
            ("deployments", self.apps.list_namespaced_deployment, self.apps.delete_namespaced_deployment),
            ("jobs", self.batch.list_namespaced_job, self.batch.delete_namespaced_job),
            ("statefulsets", self.apps.list_namespaced_stateful_set,
             self.apps.delete_namespaced_stateful_set),
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
        if spec.uses_volcano:
            name = manifests.podgroup_name(spec)
            try:
                await call(self.retry, self.custom.delete_namespaced_custom_object, VOLCANO_GROUP,
                           VOLCANO_VERSION, ns, PODGROUPS, name)
                deleted.append(f"{PODGROUPS}/{name}")
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
        """Deletes the job's keys under /paddlecloud/NS/NAME/, as `paddlecloud job delete` does."""
        from paddlecloud.etcd import connect
        from paddlecloud.keys import JobKeys

        client = await connect(spec.etcd_endpoints, timeout=self.config.etcd_timeout)
        try:
            result = await client.delete_prefix(JobKeys(spec.namespace, spec.name).prefix)
            return int(getattr(result, "deleted", 0) or 0)
        finally:
            await client.close()


def spec_of(body: Mapping[str, Any], config: OperatorConfig, *,
            podgroup: Mapping[str, Any] | None = None) -> JobSpec:
    """The one translation, with what the operator gives every job."""
    return translate(body, podgroup=podgroup, etcd_endpoints=config.etcd_endpoints,
                     image=config.image).validate()


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
            # the job's: its queue, priority and minMember (checked) are kept
            group = await jobs().companion_podgroup(body) if spec.uses_volcano else None
            if group is not None:
                spec = spec_of(body, config, podgroup=group)
                await jobs().adopt_podgroup(body)
        except JobSpecError as error:
            patch.status.update(refused_status("InvalidSpec", str(error), now=_now()))
            await jobs().event(body, kind="Warning", reason="InvalidSpec", message=str(error))
            raise kopf.PermanentError(str(error)) from None
        if await jobs().ensure_master(spec, body):
            await jobs().event(body, kind="Normal", reason="Created",
                               message=f"master Deployment {manifests.master_name(spec.name)} created")
        patch.status.update({
            **job_status(spec, deployment=None, workloads={}),
            "phase": (body.get("status") or {}).get("phase") or Phase.PENDING.value,
            "observedGeneration": body.metadata.get("generation") or 0,
        })

    @kopf.on.update(*resource, field="spec", registry=registry)
    async def changed(body: kopf.Body, **_: Any) -> None:
        await jobs().event(body, kind="Warning", reason="SpecChanged", message=(
            "a PaddleJob's spec is read when the job starts: the running job keeps its spec; "
            "delete the PaddleJob and apply it again to run the new one"))

    @kopf.timer(*resource, interval=config.interval, registry=registry)
    async def observe(body: kopf.Body, status: kopf.Status, patch: kopf.Patch, **_: Any) -> None:
        try:
            spec = spec_of(body, config)
        except JobSpecError:
            return  # `apply` reported it
        old_phase = status.get("phase")
        if not status.get("master"):
            return  # `apply` has not created the master yet
        deployment = await jobs().deployment(spec)
        if deployment is None:
            if old_phase not in {p.value for p in TERMINAL} and \
                    await jobs().ensure_master(spec, body):
                await jobs().event(body, kind="Warning", reason="MasterRecreated", message=(
                    f"master Deployment {manifests.master_name(spec.name)} was deleted while the "
                    "job ran: created again (it resumes from etcd)"))
            return
        workloads = await jobs().workloads(spec)
        new = job_status(spec, deployment=deployment, workloads=workloads)
        await _recreate_missing(spec, body=body, phase=new["phase"], workloads=workloads,
                                jobs=jobs())
        now = _now()
        new["conditions"] = conditions(new["phase"], now=now, previous=status.get("conditions"))
        if new["phase"] == Phase.RUNNING and not status.get("startTime"):
            new["startTime"] = now
        if new["phase"] in {p.value for p in TERMINAL} and not status.get("completionTime"):
            new["completionTime"] = now
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


async def _recreate_missing(spec: JobSpec, *, body: Mapping[str, Any], phase: str,
                            workloads: Mapping[str, Any], jobs: JobObjects) -> None:
    """Creates again a role workload deleted by hand, with the master's own deployer code.

    Pservers (and heters) exist from Starting on, trainers from Running on; a job
    in a terminal phase had them removed on purpose (cleanPodPolicy).
    """
    deployer = KubernetesDeployer(spec, api_client=jobs.api)
    early = [r for r in (manifests.PSERVER, manifests.HETER) if r in workloads]
    if phase in (Phase.STARTING, Phase.RUNNING) and any(workloads[r] is None for r in early):
        await deployer.create_pservers()
        await jobs.event(body, kind="Warning", reason="WorkloadRecreated", message=(
            f"{', '.join(manifests.role_name(spec.name, r) for r in early if workloads[r] is None)}"
            " deleted by hand: created again"))
    if phase == Phase.RUNNING and workloads.get(manifests.TRAINER, {}) is None:
        await deployer.create_trainers()
        await jobs.event(body, kind="Warning", reason="WorkloadRecreated", message=(
            f"Job {manifests.trainer_name(spec.name)} deleted by hand: created again"))
