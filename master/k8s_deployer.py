"""`KubernetesDeployer`: the master's deployer on Kubernetes, with the official client.

The leading master creates the job's pservers (a StatefulSet behind a headless
Service), then its trainers (an Indexed Job), and — for Volcano — a PodGroup, all
owned by the master Deployment; it reads the trainers' state from the Job's status,
removes what the clean-pod policy says when the job ends, and records the job's
phase as an annotation on the Deployment.

Every call is made off the event loop (`asyncio.to_thread`: the client blocks).
Creation is idempotent: an object that already exists and carries the job's label
is adopted (a master that took over calls everything again). Answers that may pass
(429, 500, 502, 503, 504, a broken connection) are retried with backoff a bounded
number of times; that is safe for every call made here (a create whose first try
went through answers 409 on the retry and is adopted; gets, merge patches and
deletes are idempotent). A 403 is a `KubernetesPermissionError` naming the verb,
the resource and the Role in `deploy/rbac.yaml`.

What this does NOT guarantee: that pods get scheduled or start (a pserver that
never registers keeps the job in Starting), nor garbage collection of what it
deletes (the API server's garbage collector removes the pods).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import tenacity

from master.deployer import Deployer, RoleStatus
from paddlecloud.jobspec import JobSpec
from paddlecloud.k8s import manifests

logger = logging.getLogger(__name__)

T = TypeVar("T")

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
VOLCANO_GROUP, VOLCANO_VERSION = manifests.VOLCANO_API_VERSION.split("/")
PODGROUPS = "podgroups"


class KubernetesApiError(RuntimeError):
    """The API server refused or failed a call; the message says which and why."""

    def __init__(self, message: str, *, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class KubernetesPermissionError(KubernetesApiError):
    """403: the caller's RBAC lacks a verb on a resource."""


class KubernetesConflictError(KubernetesApiError):
    """409 on an object that belongs to something else."""


@dataclass(frozen=True)
class RetryPolicy:
    """How transient API failures are retried: `attempts` tries in all, exponential waits."""

    attempts: int = 5
    initial_wait: float = 0.5
    max_wait: float = 8.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts={self.attempts}: must be >= 1")
        if self.initial_wait < 0 or self.max_wait < self.initial_wait:
            raise ValueError(
                f"RetryPolicy waits {self.initial_wait}..{self.max_wait}: need 0 <= initial <= max"
            )


def api_status(error: BaseException) -> int | None:
    """The HTTP status of a client error, None when it is not an API answer."""
    from kubernetes.client.exceptions import ApiException

    return error.status if isinstance(error, ApiException) else None


def api_message(error: BaseException) -> str:
    """The API server's own words (the Status `message`), else the error's text."""
    import json

    body = getattr(error, "body", None)
    if body:
        try:
            message = json.loads(body).get("message")
            if message:
                return str(message)
        except (ValueError, AttributeError):
            pass
    reason = getattr(error, "reason", None)
    return str(reason or error).strip()


def is_transient(error: BaseException) -> bool:
    """Worth another try: throttling, a server error, or a broken connection."""
    import urllib3

    status = api_status(error)
    if status is not None:
        return status in RETRYABLE_STATUS
    return isinstance(error, (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError))


def explain(error: BaseException, *, verb: str, resource: str, namespace: str,
            name: str = "", rights: str | None = None) -> KubernetesApiError:
    """A clear error for a failed call: what was tried, what the API said, what to do.

    `rights` says where the caller's rights come from (default: the master's Role).
    """
    status = api_status(error) or 0
    what = f"{verb} {resource}{' ' + name if name else ''} in namespace {namespace}"
    if status == 403:
        rights = rights or (
            "The master's rights come from the Role in deploy/rbac.yaml "
            f"(kubectl apply -n {namespace} -f deploy/rbac.yaml)"
        )
        return KubernetesPermissionError(
            f"forbidden to {what}: the account lacks '{verb}' on '{resource}'. {rights}; "
            f"the API said: {api_message(error)}",
            status=403,
        )
    if status == 0:
        return KubernetesApiError(f"cannot {what}: the API server is unreachable ({error})")
    return KubernetesApiError(
        f"cannot {what}: the API answered {status}: {api_message(error)}", status=status
    )


def _before_sleep(state: tenacity.RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome else None
    logger.warning("Kubernetes API call failed (%s), try %d; retrying",
                   api_status(error) or error, state.attempt_number)


def _retrying_kwargs(policy: RetryPolicy) -> dict[str, Any]:
    return {
        "stop": tenacity.stop_after_attempt(policy.attempts),
        "wait": tenacity.wait_exponential(multiplier=policy.initial_wait, min=policy.initial_wait,
                                          max=policy.max_wait),
        "retry": tenacity.retry_if_exception(is_transient),
        "before_sleep": _before_sleep,
        "reraise": True,
    }


def call_sync(policy: RetryPolicy, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """A blocking client call, retried per `policy` (for the CLI)."""
    for attempt in tenacity.Retrying(**_retrying_kwargs(policy)):
        with attempt:
            return fn(*args, **kwargs)
    raise AssertionError("unreachable")  # pragma: no cover


async def call(policy: RetryPolicy, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """A blocking client call run in a thread, retried per `policy` (for the master)."""
    async for attempt in tenacity.AsyncRetrying(**_retrying_kwargs(policy)):
        with attempt:
            return await asyncio.to_thread(fn, *args, **kwargs)
    raise AssertionError("unreachable")  # pragma: no cover


def load_api_client(kubeconfig: str | None = None) -> Any:
    """An `ApiClient`: `kubeconfig` if given, else in-cluster, else ~/.kube/config ($KUBECONFIG)."""
    from kubernetes import client, config

    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    try:
        config.load_incluster_config()
        return client.ApiClient()
    except config.ConfigException:
        pass
    try:
        return config.new_client_from_config()
    except (config.ConfigException, FileNotFoundError) as error:
        raise KubernetesApiError(
            f"no Kubernetes configuration: not in a cluster and no kubeconfig ({error}); "
            "pass --kubeconfig or set KUBECONFIG"
        ) from None


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
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    if conditions.get("Failed") == "True":
        return RoleStatus(desired=desired, active=0, succeeded=succeeded, failed=max(failed, 1))
    if conditions.get("Complete") == "True":
        return RoleStatus(desired=desired, active=0, succeeded=max(succeeded, desired), failed=failed)
    if succeeded < desired:
        active = max(active, 1)
    return RoleStatus(desired=desired, active=active, succeeded=succeeded, failed=failed)


class KubernetesDeployer(Deployer):
    """Deploys one job's pservers and trainers; owned by the job's master Deployment.

    `KubernetesDeployer(spec)` in a master pod (in-cluster credentials of the
    `paddlecloud-master` ServiceAccount); tests pass `api_client=` of their own.
    """

    def __init__(self, spec: JobSpec, *, api_client: Any | None = None,
                 retry: RetryPolicy = RetryPolicy()) -> None:
        from kubernetes import client

        self.spec = spec.validate()
        self.retry = retry
        self._api = api_client if api_client is not None else load_api_client()
        self._apps = client.AppsV1Api(self._api)
        self._core = client.CoreV1Api(self._api)
        self._batch = client.BatchV1Api(self._api)
        self._custom = client.CustomObjectsApi(self._api)
        self._owner: dict[str, Any] | None = None

    @property
    def namespace(self) -> str:
        return self.spec.namespace

    # ---- plumbing ----------------------------------------------------------------------
    def _to_dict(self, obj: Any) -> dict[str, Any]:
        return obj if isinstance(obj, dict) else self._api.sanitize_for_serialization(obj)

    def _explain(self, error: Exception, *, verb: str, resource: str, target: str) -> Exception:
        """The error to raise: API answers and lost connections explained, bugs as they are."""
        if api_status(error) is None and not is_transient(error):
            return error
        return explain(error, verb=verb, resource=resource, namespace=self.namespace, name=target)

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

    async def _ensure(self, body: dict[str, Any], *, resource: str, create: Callable[..., Any],
                      read: Callable[..., Any], create_args: tuple[Any, ...] = (),
                      read_args: tuple[Any, ...] = ()) -> dict[str, Any]:
        """Creates `body`, or adopts the object of that name when it is this job's."""
        name = body["metadata"]["name"]
        create_args = create_args or (self.namespace,)
        try:
            created = await call(self.retry, create, *create_args, body)
            logger.info("created %s %s/%s", resource, self.namespace, name)
            return self._to_dict(created)
        except Exception as error:
            if api_status(error) != 409:
                raise self._explain(error, verb="create", resource=resource, target=name) from error
        existing = await self._read(read, *(read_args or (name, self.namespace)),
                                    resource=resource, target=name)
        if existing is None:  # deleted between our create and our read: try once more
            return self._to_dict(await self._call(create, *create_args, body, verb="create",
                                                  resource=resource, target=name))
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

    async def _delete(self, fn: Callable[..., Any], *args: Any, resource: str, target: str) -> bool:
        """Deletes with background propagation; False when it was already gone."""
        from kubernetes import client

        options = client.V1DeleteOptions(propagation_policy="Background")
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
        return self._owner

    # ---- Deployer -------------------------------------------------------------------------
    async def _ensure_service(self, body: dict[str, Any]) -> None:
        await self._ensure(body, resource="services", create=self._core.create_namespaced_service,
                           read=self._core.read_namespaced_service)

    async def _ensure_podgroup(self, min_member: int) -> None:
        owner = await self.owner()
        body = manifests.podgroup(self.spec, owner, min_member=min_member)
        name = body["metadata"]["name"]
        group_args = (VOLCANO_GROUP, VOLCANO_VERSION, self.namespace, PODGROUPS)
        existing = await self._ensure(
            body, resource=PODGROUPS, create=self._custom.create_namespaced_custom_object,
            read=self._custom.get_namespaced_custom_object,
            create_args=group_args, read_args=(*group_args, name),
        )
        min_member = body["spec"]["minMember"]  # capped by the user's minMember, if any
        if (existing.get("spec") or {}).get("minMember") != min_member:
            await self._call(self._custom.patch_namespaced_custom_object, *group_args, name,
                             {"spec": {"minMember": min_member}},
                             _content_type="application/merge-patch+json",
                             verb="patch", resource=PODGROUPS, target=name)
            logger.info("PodGroup %s/%s: minMember=%d", self.namespace, name, min_member)

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
        for role, render in ((manifests.PSERVER, manifests.pserver_statefulset),
                             (manifests.HETER, manifests.heter_statefulset)):
            if not self.spec.replicas_of(role):
                continue
            for service in manifests.role_services(self.spec, role, owner=owner):
                await self._ensure_service(service)
            await self._ensure(render(self.spec, owner), resource="statefulsets",
                               create=self._apps.create_namespaced_stateful_set,
                               read=self._apps.read_namespaced_stateful_set)

    async def create_trainers(self) -> None:
        """PodGroup (minMember = pservers + trainers), trainer Service if needed, the Job."""
        owner = await self.owner()
        if self.spec.uses_volcano:
            await self._ensure_podgroup(manifests.gang_size(self.spec))
        if manifests.needs_trainer_service(self.spec):
            for service in manifests.role_services(self.spec, manifests.TRAINER, owner=owner):
                await self._ensure_service(service)
        await self._ensure(manifests.trainer_job(self.spec, owner), resource="jobs",
                           create=self._batch.create_namespaced_job,
                           read=self._batch.read_namespaced_job)

    async def trainer_status(self) -> RoleStatus:
        name = manifests.trainer_name(self.spec.name)
        job = await self._read(self._batch.read_namespaced_job, name, self.namespace,
                               resource="jobs", target=name)
        return role_status_of_job(job, desired=self.spec.trainers)

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

    async def annotate_phase(self, phase: str) -> None:
        """Records the phase as the `paddlecloud.org/phase` annotation of the master Deployment."""
        name = manifests.master_name(self.spec.name)
        await self._call(self._apps.patch_namespaced_deployment, name, self.namespace,
                         {"metadata": {"annotations": {manifests.PHASE_ANNOTATION: phase}}},
                         _content_type="application/merge-patch+json",
                         verb="patch", resource="deployments", target=name)
