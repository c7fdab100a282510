"""`KubernetesDeployer`: the master's deployer on Kubernetes, with the official client.

The leading master creates the job's pservers (a StatefulSet behind a headless
Service), then its trainers (an Indexed Job), and — for Volcano — a PodGroup, all
owned by the master Deployment; it reads the trainers' state from the Job's status,
removes what the clean-pod policy says when the job ends, and records the job's
phase as an annotation on the Deployment.

Every call is made off the event loop (`asyncio.to_thread`: the client blocks).
Every object is created, and changed, by a server-side apply of the `paddlecloud-master`
field manager (docs/kubernetes.md, "Server-side apply"), so a field another manager set
(a user's annotation) stays theirs. Creation is idempotent: an object that already
exists and carries the job's label is adopted (a master that took over calls everything
again). Answers that may pass are retried per `paddlecloud.backends.k8s.client`; that
is safe for every call made here (an apply states the same fields again; gets and
deletes are idempotent). A 403 is a `KubernetesPermissionError`
naming the verb, the resource and the job's master Role (`manifests.master_rules`). The Job and the
StatefulSet controllers replace failed pods, so in PS mode `reconcile` has nothing
to do here.

Elastic jobs: in PS mode `scale(n)` patches the Indexed Job's parallelism and
completions together (an elastic Indexed Job, Kubernetes >= 1.27): the Job
controller adds pods with the next indexes, or removes the highest ones (SIGTERM:
the trainer leaves the master and its tasks return at once); the pods' template,
`PADDLE_TRAINERS_NUM` included, stays the one the Job was created with. In
collective mode a group cannot change its world size, nor lose a member, in
flight, so a resize or a lost member (a trainer pod gone, failed or restarted) is
a **group restart**: the trainer Job is deleted with foreground propagation (the
pods get their termination grace, then are killed) and, once it is gone, the
master's epoch is restarted at the checkpoint and the Job created again at the
new size, with `PADDLE_TRAINERS_NUM`, `PADDLE_TRAINER_ENDPOINTS` and indexes
0..N-1 recomputed, and with the labels and annotations a user put on the Job before
(`users_metadata`: a user's edit survives the re-creation). Deleting and recreating is what converges fastest and safely:
a Job's pod template cannot change, and the old pods are gone before the new
ones take their host names. Past `restart_limit` lost members the deployer gives
up (`JobSpec.restart_limit`, `job submit --restart-limit`, a PaddleJob's `spec.restartLimit`):
the Job is deleted and `trainer_status()` says why (the job ends Failed).

A role workload deleted by hand while the job runs is created again at the next
`reconcile` (the master is the job's one deployer: the operator only reads workloads);
a suspend the operator asks on the master Deployment (`suspend_requested`) is the
master's own drain (`suspend`): the trainer Job deleted as a group, then the pservers.

What this does NOT guarantee: that pods get scheduled or start (a pserver that
never registers keeps the job in Starting), nor garbage collection of what it
deletes (the API server's garbage collector removes the pods).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from paddlecloud.backends.k8s import manifests
from paddlecloud.backends.k8s.client import (
    KEPT_USER_FIELDS_MANAGER,
    MASTER_MANAGER,
    KubernetesApiError,
    KubernetesConflictError,
    RetryPolicy,
    api_status,
    applied,
    apply_body,
    call,
    explained,
    load_api_client,
)
from paddlecloud.deployer import Deployer, RoleStatus
from paddlecloud.jobspec import JobSpec
from paddlecloud.phase import Phase

logger = logging.getLogger(__name__)

T = TypeVar("T")

VOLCANO_GROUP, VOLCANO_VERSION = manifests.VOLCANO_API_VERSION.split("/")
PODGROUPS = "podgroups"
DEFAULT_RETRY = RetryPolicy()
GROUP_DELETE_TIMEOUT = 300.0   # seconds the trainer Job's pods get to go in a group restart
GROUP_DELETE_POLL = 0.5
# the master Deployment's annotations the master applies (docs/kubernetes.md, "Server-side apply")
SHOWN_ANNOTATIONS = (manifests.PHASE_ANNOTATION, manifests.PHASE_REASON_ANNOTATION,
                     manifests.EPOCH_ANNOTATION, manifests.TASKS_ANNOTATION,
                     manifests.GOODPUT_ANNOTATION, manifests.RESTARTING_ANNOTATION,
                     manifests.RESUME_ANNOTATION)


def should_clean(policy: str, *, succeeded: bool) -> bool:
    """paddle-operator's cleanPodPolicy: which ending removes the pservers and trainers."""
    if policy == "Always":
        return True
    if policy == "OnFailure":
        return not succeeded
    if policy == "OnCompletion":
        return succeeded
    if policy == "Never":
        return False
    raise ValueError(f"unknown cleanPodPolicy {policy!r}")


def role_status_of_job(job: dict[str, Any] | None, *, desired: int) -> RoleStatus:
    """The trainers as the Job's status shows them.

    The Job's terminal conditions decide: `Failed` (backoffLimit reached) reports
    nothing active and at least one failure; `Complete` reports the completions.
    Before that, the Job controller still runs or replaces trainers, so a Job with
    no terminal condition reports at least one active trainer even in the instant
    between a pod's failure and its replacement.
    """
    if job is None:
        return RoleStatus(desired=desired)
    status = job.get("status") or {}
    active = int(status.get("active") or 0)
    succeeded = int(status.get("succeeded") or 0)
    failed = int(status.get("failed") or 0)
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    failed_condition = conditions.get("Failed") or {}
    if failed_condition.get("status") == "True":
        detail = ": ".join(str(failed_condition[k]) for k in ("reason", "message")
                           if failed_condition.get(k))
        return RoleStatus(desired=desired, active=0, succeeded=succeeded, failed=max(failed, 1),
                          detail=f"the trainer Job failed: {detail or 'no reason given'}")
    if (conditions.get("Complete") or {}).get("status") == "True":
        return RoleStatus(desired=desired, active=0, succeeded=max(succeeded, desired), failed=failed)
    if succeeded < desired:
        active = max(active, 1)
    return RoleStatus(desired=desired, active=active, succeeded=succeeded, failed=failed)


# Labels the Job controller sets without a prefix (Kubernetes' own, not a user's)
_JOB_CONTROLLER_LABELS = frozenset({"controller-uid", "job-name"})


def _system_key(key: str) -> bool:
    """A label or annotation key Kubernetes or paddlecloud sets, never a user's."""
    prefix = key.partition("/")[0] if "/" in key else ""
    return key in _JOB_CONTROLLER_LABELS or prefix in ("kubernetes.io", "k8s.io",
                                                       manifests.JOB_LABEL.partition("/")[0]) \
        or prefix.endswith((".kubernetes.io", ".k8s.io"))


def users_metadata(existing: dict[str, Any] | None,
                   rendered: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The labels and annotations of `existing` that paddlecloud does not render and that
    Kubernetes did not set: a user's, kept when the object is made again (a group restart)."""
    kept: dict[str, dict[str, str]] = {}
    for field in ("labels", "annotations"):
        ours = rendered["metadata"].get(field) or {}
        theirs = ((existing or {}).get("metadata") or {}).get(field) or {}
        if users := {k: v for k, v in theirs.items() if k not in ours and not _system_key(k)}:
            kept[field] = users
    return kept


def template_size(job: dict[str, Any], *, default: int) -> int:
    """The trainers' number the Job's pods' template was rendered for (PADDLE_TRAINERS_NUM):
    an adopted PS Job scaled since keeps the template it was created with."""
    containers = (((job.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
        "containers") or []
    for container in containers:
        for env in container.get("env") or []:
            if env.get("name") == "PADDLE_TRAINERS_NUM" and str(env.get("value", "")).isdigit():
                return int(env["value"])
    return default


class KubernetesDeployer(Deployer):
    """Deploys one job's pservers and trainers; owned by the job's master Deployment.

    `KubernetesDeployer(spec)` in a master pod (in-cluster credentials of the
    `paddlecloud-master` ServiceAccount); tests pass `api_client=` of their own.
    """

    def __init__(self, spec: JobSpec, *, api_client: Any | None = None,
                 retry: RetryPolicy = DEFAULT_RETRY,
                 restart_epoch: Callable[[], Awaitable[None]] | None = None,
                 restart_limit: int | None = None) -> None:
        from kubernetes import client

        if restart_limit is not None and restart_limit < 0:
            raise ValueError(f"restart_limit={restart_limit}: must be >= 0")
        self.spec = spec.validate()
        self.retry = retry
        self.size = self.spec.trainers   # the trainer group's size now (scale changes it)
        self.restarts = 0                # group restarts after a lost member
        self.restart_limit = spec.restart_limit if restart_limit is None else restart_limit
        self._restart_epoch = restart_epoch
        self._members: dict[str, int] | None = None  # the group's pods -> their restart counts
        self._finishing = False
        self._gave_up = ""
        self._api = api_client if api_client is not None else load_api_client()
        self._apps = client.AppsV1Api(self._api)
        self._core = client.CoreV1Api(self._api)
        self._batch = client.BatchV1Api(self._api)
        self._custom = client.CustomObjectsApi(self._api)
        self._owner: dict[str, Any] | None = None
        self._resume = False             # the operator started this master after a suspend
        self._companion_uid = ""         # a PodGroup applied with the PaddleJob, to adopt
        self._recreated = 0              # role workloads created again after a deletion by hand
        self._users_metadata: dict[str, dict[str, str]] = {}  # kept across a group restart
        self._shown: dict[str, str] = {}  # the annotations this master applied to its Deployment
        self._started_size = self.size   # the size the running group was started at
        self._template_size = self.size  # the size its pods' template was rendered for

    @property
    def namespace(self) -> str:
        return self.spec.namespace

    # ---- plumbing ----------------------------------------------------------------------
    def _to_dict(self, obj: Any) -> dict[str, Any]:
        return obj if isinstance(obj, dict) else self._api.sanitize_for_serialization(obj)

    def _explain(self, error: Exception, *, verb: str, resource: str, target: str) -> Exception:
        return explained(error, verb=verb, resource=resource, namespace=self.namespace, name=target)

    async def _call(self, fn: Callable[..., T], *args: Any, verb: str, resource: str, target: str,
                    **kwargs: Any) -> T:
        try:
            return await call(self.retry, fn, *args, **kwargs)
        except Exception as error:
            raise self._explain(error, verb=verb, resource=resource, target=target) from error

    async def _read(self, fn: Callable[..., Any], *args: Any, resource: str,
                    target: str) -> dict[str, Any] | None:
        """The object as a dict, None when it does not exist."""
        try:
            obj = await call(self.retry, fn, *args)
        except Exception as error:
            if api_status(error) == 404:
                return None
            raise self._explain(error, verb="get", resource=resource, target=target) from error
        return self._to_dict(obj)

    async def _ensure(self, body: dict[str, Any], *, resource: str, patch: Callable[..., Any],
                      read: Callable[..., Any], target_args: tuple[Any, ...] = ()) -> dict[str, Any]:
        """Creates `body` by a server-side apply of the master's, or adopts the object of that
        name when it is this job's, as it is (a master that took over keeps the size its trainers
        were scaled to). Read first: an apply would merge into another's object of that name."""
        name = body["metadata"]["name"]
        target_args = target_args or (name, self.namespace)
        existing = await self._read(read, *target_args, resource=resource, target=name)
        if existing is None:
            created = await self._call(patch, *target_args, body, **applied(MASTER_MANAGER),
                                       verb="apply", resource=resource, target=name)
            logger.info("created %s %s/%s", resource, self.namespace, name)
            return self._to_dict(created)
        owner_job = ((existing.get("metadata") or {}).get("labels") or {}).get(manifests.JOB_LABEL)
        if owner_job != self.spec.name:
            raise KubernetesConflictError(
                f"{resource} {name} already exists in namespace {self.namespace} and does not "
                f"belong to job {self.spec.name} (its {manifests.JOB_LABEL} label is "
                f"{owner_job!r}): delete it or choose another job name",
                status=409,
            )
        logger.info("adopted existing %s %s/%s", resource, self.namespace, name)
        return existing

    async def _delete(self, fn: Callable[..., Any], *args: Any, resource: str, target: str,
                      propagation: str = "Background") -> bool:
        """Deletes with background (or `propagation`) propagation; False when it was already gone."""
        from kubernetes import client

        options = client.V1DeleteOptions(propagation_policy=propagation)
        try:
            await call(self.retry, fn, *args, body=options)
        except Exception as error:
            if api_status(error) == 404:
                return False
            raise self._explain(error, verb="delete", resource=resource, target=target) from error
        logger.info("deleted %s %s/%s", resource, self.namespace, target)
        return True

    # ---- the owner --------------------------------------------------------------------
    async def owner(self) -> dict[str, Any]:
        """The owner reference to the master Deployment (read once: its uid never changes)."""
        if self._owner is None:
            name = manifests.master_name(self.spec.name)
            deployment = await self._read(self._apps.read_namespaced_deployment, name,
                                          self.namespace, resource="deployments", target=name)
            if deployment is None:
                raise KubernetesApiError(
                    f"the master Deployment {name} does not exist in namespace {self.namespace}: "
                    "the deployer runs inside the job's master (paddlecloud job submit creates it)",
                    status=404,
                )
            uid = (deployment.get("metadata") or {}).get("uid")
            if not uid:
                raise KubernetesApiError(f"the master Deployment {name} has no uid")
            self._owner = manifests.owner_reference(self.spec.name, uid)
            annotations = (deployment.get("metadata") or {}).get("annotations") or {}
            self._resume = annotations.get(manifests.RESUME_ANNOTATION) == manifests.RESUME_PENDING
            self._companion_uid = annotations.get(manifests.COMPANION_PODGROUP_ANNOTATION) or ""
            # what an earlier leader showed stays shown: this master's applies state it again (an
            # apply that omitted a field its manager applied before would remove it)
            self._shown = {key: annotations[key] for key in SHOWN_ANNOTATIONS
                           if key in annotations} | self._shown
        return self._owner

    async def _master_annotations(self) -> dict[str, str]:
        name = manifests.master_name(self.spec.name)
        deployment = await self._read(self._apps.read_namespaced_deployment, name,
                                      self.namespace, resource="deployments", target=name)
        return dict(((deployment or {}).get("metadata") or {}).get("annotations") or {})

    # ---- Deployer -------------------------------------------------------------------------
    async def _ensure_service(self, body: dict[str, Any]) -> None:
        await self._ensure(body, resource="services", patch=self._core.patch_namespaced_service,
                           read=self._core.read_namespaced_service)

    async def _ensure_podgroup(self, min_member: int) -> None:
        owner = await self.owner()
        body = manifests.podgroup(self.spec, owner, min_member=min_member)
        name = body["metadata"]["name"]
        group_args = (VOLCANO_GROUP, VOLCANO_VERSION, self.namespace, PODGROUPS)
        if self._companion_uid:
            await self._adopt_companion_podgroup(group_args, name, owner)
        existing = await self._ensure(
            body, resource=PODGROUPS, patch=self._custom.patch_namespaced_custom_object,
            read=self._custom.get_namespaced_custom_object, target_args=(*group_args, name),
        )
        min_member = body["spec"]["minMember"]  # capped by the user's minMember, if any
        if (existing.get("spec") or {}).get("minMember") != min_member:
            # The whole PodGroup again where the master made it: an apply states every field its
            # manager keeps (one that stated only minMember would remove the labels and owner its
            # create applied); only minMember on one it adopted (applied with the PaddleJob: the
            # user's, owned by the PaddleJob). Not forced: the user may own minMember
            made = owner["uid"] in {o.get("uid") for o in
                                    (existing.get("metadata") or {}).get("ownerReferences") or []}
            stated = body if made else apply_body(
                {"spec": {"minMember": min_member}}, api_version=manifests.VOLCANO_API_VERSION,
                kind="PodGroup", name=name, namespace=self.namespace)
            await self._call(self._custom.patch_namespaced_custom_object, *group_args, name,
                             stated, **applied(MASTER_MANAGER),
                             verb="apply", resource=PODGROUPS, target=name)
            logger.info("PodGroup %s/%s: minMember=%d", self.namespace, name, min_member)

    async def _adopt_companion_podgroup(self, group_args: tuple[Any, ...], name: str,
                                        owner: dict[str, Any]) -> None:
        """Labels the PodGroup applied with the PaddleJob (the one whose uid the operator
        recorded on the master Deployment) as the job's, owned by the master Deployment: the
        job's own from then on (its queue, priority and minMember were read into the spec).
        Any other PodGroup of that name stays a conflict (`_ensure`)."""
        existing = await self._read(self._custom.get_namespaced_custom_object, *group_args, name,
                                    resource=PODGROUPS, target=name)
        meta = (existing or {}).get("metadata") or {}
        if meta.get("uid") == self._companion_uid and \
                manifests.JOB_LABEL not in (meta.get("labels") or {}):
            await self._call(self._custom.patch_namespaced_custom_object, *group_args, name,
                             apply_body({"metadata": {"labels": {manifests.JOB_LABEL: self.spec.name},
                                                      "ownerReferences": [owner]}},
                                        api_version=manifests.VOLCANO_API_VERSION,
                                        kind="PodGroup", name=name, namespace=self.namespace),
                             **applied(MASTER_MANAGER),
                             verb="apply", resource=PODGROUPS, target=name)
            logger.info("adopted the PodGroup %s/%s applied with the job", self.namespace, name)
        self._companion_uid = ""

    def _trainer_gang(self) -> int:
        """The PodGroup's minMember once the trainers are deployed: every other role plus, in
        PS mode, the job's MIN trainers (EDL's rule, kept by every scale: trainers above the
        min are extra, scheduled as room comes, never part of the gang the job needs to run);
        a collective group needs all its members, so there it is the group's size."""
        least = self.size if self.spec.collective else self.spec.trainer_range.minimum
        return manifests.gang_size(self.spec.replace(trainers=least))

    async def create_pservers(self) -> None:
        """PodGroup (minMember = pservers and heters, for now), Services, StatefulSets."""
        if not self.spec.pservers:
            return
        owner = await self.owner()
        early = manifests.gang_size(self.spec, (manifests.PSERVER, manifests.HETER))
        if early:
            # The trainers come only once every pserver has registered, so a gang of
            # pservers + trainers could never form yet: the group grows in create_trainers.
            await self._ensure_podgroup(early)
        await self._ensure_pserver_workloads(owner)

    async def _ensure_pserver_workloads(self, owner: dict[str, Any]) -> None:
        """The pservers' and heters' Services and StatefulSets (created, or adopted)."""
        for role, render in ((manifests.PSERVER, manifests.pserver_statefulset),
                             (manifests.HETER, manifests.heter_statefulset)):
            if not self.spec.replicas_of(role):
                continue
            for service in manifests.role_services(self.spec, role, owner=owner):
                await self._ensure_service(service)
            await self._ensure(render(self.spec, owner), resource="statefulsets",
                               patch=self._apps.patch_namespaced_stateful_set,
                               read=self._apps.read_namespaced_stateful_set)

    async def create_trainers(self) -> None:
        """PodGroup (minMember = pservers + trainers), trainer Service if needed, the Job."""
        owner = await self.owner()
        sized = self.spec.replace(trainers=self.size)
        await self._resume_at_checkpoint()
        if self.spec.uses_volcano:
            await self._ensure_podgroup(self._trainer_gang())
        if manifests.needs_trainer_service(sized):
            for service in manifests.role_services(sized, manifests.TRAINER, owner=owner):
                await self._ensure_service(service)
        job = await self._ensure(manifests.trainer_job(sized, owner), resource="jobs",
                                 patch=self._batch.patch_namespaced_job,
                                 read=self._batch.read_namespaced_job)
        await self._restore_users_metadata(manifests.trainer_name(self.spec.name))
        if self._resume:  # the group runs again: the resume is done
            await self._annotate_master({manifests.RESUME_ANNOTATION: manifests.RESUME_DONE,
                                         manifests.SUSPENDED_ANNOTATION: ""})
            self._resume = False
        # an adopted Job (a master that took over) keeps the size it was scaled to
        self.size = int((job.get("spec") or {}).get("parallelism") or self.size)
        self._started_size = self.size
        self._template_size = template_size(job, default=sized.trainers)

    async def _resume_at_checkpoint(self) -> None:
        """A job whose trainers start again after a suspend (its master was stopped, the
        group and the pservers too, and the operator marked the master it started again)
        resumes where the checkpoint is: the epoch is restarted there first, as in a group
        restart, so no task the model never consumed stays counted done. That holds for a
        PS job too: its pservers, started again on their slots, restore that same checkpoint
        (`PADDLECLOUD_PSERVER_RESTORE=1`, pserver_agent/supervisor.py), so what they learnt
        after it is read again, once. A master that takes over a group that still runs (its
        trainer Job exists) restarts nothing. The mark is removed once the group runs again;
        a master lost in between restarts the epoch there again (the same position: nothing
        changes)."""
        if not (self._resume and self._restart_epoch is not None):
            return
        name = manifests.trainer_name(self.spec.name)
        if await self._read(self._batch.read_namespaced_job, name, self.namespace,
                            resource="jobs", target=name) is not None:
            return
        logger.info("the trainer group of %s starts again after a suspend: restarting the epoch "
                    "at the checkpoint", self.spec.name)
        await self._restart_epoch()

    async def scale(self, trainers: int) -> None:
        """PS: the Job's parallelism and completions; collective: a group restart at `trainers`."""
        if trainers < 1:
            raise ValueError(f"scale to {trainers} trainers: need at least 1")
        if trainers == self.size or self._finishing or self._gave_up:
            return
        before, self.size = self.size, trainers
        logger.info("scaling the trainers of %s: %d -> %d", self.spec.name, before, trainers)
        if self.spec.collective:
            await self._restart_group()
            return
        name = manifests.trainer_name(self.spec.name)
        if self.spec.uses_volcano:
            await self._ensure_podgroup(self._trainer_gang())
        # The Job as it was created, at its new size: an apply states every field its manager
        # keeps, and the pods' template cannot change. Forced: the master owns the trainers'
        # number (docs/kubernetes.md, "Server-side apply")
        job = manifests.trainer_job(self.spec.replace(trainers=self._template_size),
                                    await self.owner())
        job["spec"].update(parallelism=trainers, completions=trainers)
        await self._call(self._batch.patch_namespaced_job, name, self.namespace, job,
                         **applied(MASTER_MANAGER, force=True),
                         verb="apply", resource="jobs", target=name)

    async def restart_trainers(self) -> None:
        """The group restart of a collective job that lost a member (counts against the limit)."""
        self.restarts += 1
        await self._restart_group()

    async def _restart_group(self) -> None:
        """Stops the group, restarts the epoch at the checkpoint, starts the group again; the
        master Deployment says so meanwhile (the operator's Restarting condition)."""
        await self._mark_restarting(self._restart_reason())
        await self._stop_and_restart_group()
        await self._mark_restarting("")

    async def _mark_restarting(self, reason: str) -> None:
        """A courtesy to the Deployment's readers: an API error is logged, never fails a restart."""
        try:
            await self._annotate_master({manifests.RESTARTING_ANNOTATION: reason or ""})
        except KubernetesApiError as error:
            logger.info("could not annotate the master Deployment (restarting: %s): %s",
                        reason, error)

    def _restart_reason(self) -> str:
        if self.size != self._started_size:
            return f"resize from {self._started_size} to {self.size} trainers"
        return f"a trainer was lost (group restart {self.restarts} of at most {self.restart_limit})"

    async def _stop_group(self) -> None:
        """Deletes the trainer Job with foreground propagation (each pod gets its SIGTERM and
        termination grace: the trainers drain and save), and waits until it is gone."""
        name = manifests.trainer_name(self.spec.name)
        await self._delete(self._batch.delete_namespaced_job, name, self.namespace,
                           resource="jobs", target=name, propagation="Foreground")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + GROUP_DELETE_TIMEOUT
        while await self._read(self._batch.read_namespaced_job, name, self.namespace,
                               resource="jobs", target=name) is not None:
            if loop.time() > deadline:
                raise KubernetesApiError(f"the trainer Job {self.namespace}/{name} was not gone "
                                         f"{GROUP_DELETE_TIMEOUT:g}s after its deletion", status=504)
            await asyncio.sleep(GROUP_DELETE_POLL)

    async def _restore_users_metadata(self, name: str) -> None:
        """Gives the trainer Job made again the labels and annotations a user had put on the
        one before (by their own field manager: see KEPT_USER_FIELDS_MANAGER)."""
        kept, self._users_metadata = self._users_metadata, {}
        if not kept:
            return
        body = apply_body({"metadata": dict(kept)}, api_version="batch/v1", kind="Job", name=name,
                          namespace=self.namespace)
        await self._call(self._batch.patch_namespaced_job, name, self.namespace, body,
                         **applied(KEPT_USER_FIELDS_MANAGER, force=True),
                         verb="apply", resource="jobs", target=name)

    async def _stop_and_restart_group(self) -> None:
        name = manifests.trainer_name(self.spec.name)
        before = await self._read(self._batch.read_namespaced_job, name, self.namespace,
                                  resource="jobs", target=name)
        # a user's labels and annotations on the group's Job outlive its re-creation
        self._users_metadata = users_metadata(before, manifests.trainer_job(self.spec, None))
        await self._stop_group()
        if self._restart_epoch is not None:
            await self._restart_epoch()
        self._members = None
        await self.create_trainers()

    async def reconcile(self) -> None:
        """A role workload deleted by hand is created again; collective jobs: a lost member
        restarts the group. The controllers replace the pods of the workloads that exist."""
        if self._gave_up:
            return
        await self._recreate_missing()
        if not self.spec.collective:
            return  # a group is restarted after the data's end too: `Deployer.finishing`
        pods = await self._trainer_pods()
        if self._members is None:
            if len(pods) >= self.size:
                self._members = pods  # the group, once every member runs
                logger.info("the trainer group of %d runs: %s", self.size, ", ".join(sorted(pods)))
            return
        lost = sorted(p for p, restarts in self._members.items()
                      if p not in pods or pods[p] > restarts)
        if not lost:
            return
        if self.restarts >= self.restart_limit:
            self._gave_up = (f"trainer pod(s) {', '.join(lost)} lost; the trainer group was "
                             f"restarted {self.restarts} times (--restart-limit {self.restart_limit})")
            logger.error("giving up on the trainers: %s", self._gave_up)
            name = manifests.trainer_name(self.spec.name)
            await self._delete(self._batch.delete_namespaced_job, name, self.namespace,
                               resource="jobs", target=name)
            return
        logger.warning("trainer pod(s) %s lost: restarting the trainer group", ", ".join(lost))
        await self.restart_trainers()

    async def _recreate_missing(self) -> None:
        """Creates again the pserver (or heter) StatefulSet and, until the data is done, the
        trainer Job, when one was deleted by hand while the job runs (a collective group so
        lost restarts at the checkpoint, as after a lost member, without counting against the
        restart limit: nothing failed). Logged, and shown on the master Deployment
        (RECREATED_ANNOTATION) for the operator's WorkloadRecreated Event."""
        gone = [manifests.role_name(self.spec.name, role)
                for role in (manifests.PSERVER, manifests.HETER) if self.spec.replicas_of(role)
                and await self._read(self._apps.read_namespaced_stateful_set,
                                     manifests.role_name(self.spec.name, role), self.namespace,
                                     resource="statefulsets", target=role) is None]
        if gone:  # the PodGroup keeps its gang: the trainers are there
            await self._ensure_pserver_workloads(await self.owner())
        trainers = manifests.trainer_name(self.spec.name)
        if not self._finishing and await self._read(
                self._batch.read_namespaced_job, trainers, self.namespace, resource="jobs",
                target=trainers) is None:
            gone.append(trainers)
            if self.spec.collective:
                await self._restart_group()
            else:
                await self.create_trainers()
        if gone:
            self._recreated += len(gone)
            what = f"{', '.join(gone)} deleted by hand while the job ran: created again"
            logger.warning("%s", what)
            await self._annotate_master({manifests.RECREATED_ANNOTATION: f"{self._recreated}: {what}"})

    async def suspend_requested(self) -> bool:
        """Whether the operator asks this job to stop (spec.suspend, a Kueue eviction)."""
        annotations = await self._master_annotations()
        return annotations.get(manifests.SUSPEND_ANNOTATION) == "true"

    async def suspend(self) -> None:
        """Stops the job for a suspend: the trainer group first, as a whole, each pod with its
        termination grace (the trainers drain and save: docs/design.md's preemption
        checkpoint), then the pservers; says so on the master Deployment. What deploys the
        job again (a resume) restarts the epoch at the checkpoint first."""
        logger.info("suspend requested: draining the trainers of %s, then removing its "
                    "pservers", self.spec.name)
        await self._stop_group()
        for role in (manifests.HETER, manifests.PSERVER):
            name = manifests.role_name(self.spec.name, role)
            if self.spec.replicas_of(role):
                await self._delete(self._apps.delete_namespaced_stateful_set, name,
                                   self.namespace, resource="statefulsets", target=name,
                                   propagation="Foreground")
        self._members = None
        self._resume = True
        await self._annotate_master({manifests.SUSPENDED_ANNOTATION: "true"})
        logger.info("job %s suspended: its workloads are gone", self.spec.name)

    async def _trainer_pods(self) -> dict[str, int]:
        """The job's live trainer pods (not being deleted, not failed) -> their containers' restarts."""
        listed = await self._call(self._core.list_namespaced_pod, self.namespace,
                                  label_selector=manifests.label_selector(self.spec.name, manifests.TRAINER),
                                  verb="list", resource="pods", target="")
        pods: dict[str, int] = {}
        for pod in self._to_dict(listed).get("items") or []:
            meta, status = pod.get("metadata") or {}, pod.get("status") or {}
            labels = meta.get("labels") or {}
            if (labels.get(manifests.JOB_LABEL) != self.spec.name
                    or labels.get(manifests.ROLE_LABEL) != manifests.TRAINER
                    or meta.get("deletionTimestamp") or status.get("phase") == "Failed"):
                continue
            pods[meta["name"]] = sum(int(c.get("restartCount") or 0)
                                     for c in status.get("containerStatuses") or [])
        return pods

    async def finishing(self) -> None:
        """From now on nothing is resized; a PS pod the Job controller replaces is told JOB_DONE
        and exits 0. A collective group that loses a member is still restarted (`reconcile`)."""
        self._finishing = True

    async def trainer_status(self) -> RoleStatus:
        if self._gave_up:
            return RoleStatus(desired=self.size, active=0, failed=1, detail=self._gave_up)
        name = manifests.trainer_name(self.spec.name)
        job = await self._read(self._batch.read_namespaced_job, name, self.namespace,
                               resource="jobs", target=name)
        return role_status_of_job(job, desired=self.size)

    async def cleanup(self, *, succeeded: bool) -> None:
        """Deletes the trainers, pservers, their Services and the PodGroup, if the policy says so."""
        policy = self.spec.clean_pod_policy
        if not should_clean(policy, succeeded=succeeded):
            logger.info("cleanPodPolicy %s keeps the pods of a %s job", policy,
                        "succeeded" if succeeded else "failed")
            return
        job = manifests.trainer_name(self.spec.name)
        ns = self.namespace
        await self._delete(self._batch.delete_namespaced_job, job, ns, resource="jobs", target=job)
        for role in (manifests.HETER, manifests.PSERVER):
            name = manifests.role_name(self.spec.name, role)
            await self._delete(self._apps.delete_namespaced_stateful_set, name, ns,
                               resource="statefulsets", target=name)
        for role in (manifests.TRAINER, manifests.HETER, manifests.PSERVER):
            for service in manifests.role_services(self.spec, role, owner=None):
                name = service["metadata"]["name"]
                await self._delete(self._core.delete_namespaced_service, name, ns,
                                   resource="services", target=name)
        if self.spec.uses_volcano:
            group = manifests.podgroup_name(self.spec)
            await self._delete(self._custom.delete_namespaced_custom_object, VOLCANO_GROUP,
                               VOLCANO_VERSION, ns, PODGROUPS, group, resource=PODGROUPS,
                               target=group)

    async def show_epoch(self, epoch: int, num_epochs: int, tasks_done: int | None = None,
                         tasks: int | None = None) -> None:
        """Records the data's epoch as "current/total", and the epoch's tasks as "done/total"
        when given, annotations of the master Deployment (the operator's progress and ETA)."""
        shown = {manifests.EPOCH_ANNOTATION: f"{epoch}/{num_epochs}"}
        if tasks is not None:
            shown[manifests.TASKS_ANNOTATION] = f"{tasks_done or 0}/{tasks}"
        await self._annotate_master(shown)

    async def show_goodput(self, trainer_seconds: Mapping[str, float]) -> None:
        """Records the job's trainer-seconds by cause, whole seconds, an annotation of the master
        Deployment (the PaddleJob's status.goodput)."""
        await self._annotate_master({manifests.GOODPUT_ANNOTATION: ",".join(
            f"{cause}={seconds:.0f}" for cause, seconds in trainer_seconds.items())})

    async def show_phase(self, phase: Phase, *, reason: str = "") -> None:
        """Records the phase and its reason as annotations of the master Deployment."""
        await self._annotate_master({manifests.PHASE_ANNOTATION: phase.value,
                                     manifests.PHASE_REASON_ANNOTATION: reason})

    async def _annotate_master(self, annotations: dict[str, str]) -> None:
        """Applies `annotations` to the master Deployment's, with every annotation this master
        showed before (an apply states all its manager keeps; "" is "none"), forced: the
        master owns them (the Deployment's creator wrote the first phase)."""
        await self.owner()  # what earlier leaders showed, read once
        self._shown.update(annotations)
        name = manifests.master_name(self.spec.name)
        await self._call(self._apps.patch_namespaced_deployment, name, self.namespace,
                         apply_body({"metadata": {"annotations": dict(self._shown)}},
                                    api_version="apps/v1", kind="Deployment", name=name,
                                    namespace=self.namespace),
                         **applied(MASTER_MANAGER, force=True),
                         verb="apply", resource="deployments", target=name)
