"""Creating, reading and deleting one job's objects: the code `job submit` and the job server share.

Where the operator runs, a job whose package is in its image can go in as a
PaddleJob instead (`create_paddlejob`); with `paddlejobs=True`, reads and deletes
see both kinds.

`create_job` is the one path from rendered objects (`manifests.submit_objects`) to the
API server, every object created by a server-side apply of `paddlecloud-cli`
(docs/kubernetes.md, "Server-side apply"): the ConfigMaps, then the master Deployment, then (the name now the job's)
its own etcd user (`paddlecloud.etcd_users`, where this process holds etcd's root
credentials), its Service, its ServiceAccount, Role and RoleBinding, its tokens and etcd
user Secrets and NetworkPolicies, and the
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
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paddlecloud.backends.k8s import manifests
from paddlecloud.jobspec import PADDLEJOB_API_VERSION, PADDLEJOB_KIND, JobSpec, JobSpecError
from paddlecloud.package_names import check_package_names
from paddlecloud.paddlejob import KUEUE_QUEUE_LABEL, own_keys
from paddlecloud.phase import Phase
from paddlecloud.trainer_package import package_paths, with_requirements

if TYPE_CHECKING:
    from paddlecloud.etcd_users import JobEtcdUser

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
    from paddlecloud.backends.k8s.client import RetryPolicy, api_status, call_sync, explained

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


def read_package(path: Path, *, warn: Callable[[str], None] = logger.warning) -> dict[str, bytes]:
    """The files of a package directory by relative path (hidden files and caches skipped),
    seed 001's requirments.txt read as requirements.txt (`warn` hears it)."""
    if not path.is_dir():
        raise JobSpecError(f"package path {str(path)!r} is not a directory")
    files = {rel: (path / rel).read_bytes() for rel in package_paths(path)}
    if not files:
        raise JobSpecError(f"package path {str(path)!r} holds no files")
    check_package_names(files)
    return with_requirements(files, where=f"package {str(path)[:200]!r}", warn=warn)


def to_dict(api: Any, obj: Any) -> dict[str, Any]:
    return obj if isinstance(obj, dict) else api.sanitize_for_serialization(obj)


PSS_ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"


def may_run_as_root(spec: JobSpec) -> list[str]:
    """The containers of the job's pods (`role/container`) that the restricted Pod Security
    Standard refuses because nothing says they run as non-root."""
    found = []
    for obj in manifests.master_objects(spec, None):
        if obj["kind"] not in ("StatefulSet", "Job"):
            continue
        pod = obj["spec"]["template"]["spec"]
        pod_says = (pod.get("securityContext") or {}).get("runAsNonRoot")
        for container in [*(pod.get("initContainers") or []), *pod["containers"]]:
            if not (container.get("securityContext") or {}).get("runAsNonRoot", pod_says):
                found.append(f"{obj['metadata']['labels'][manifests.ROLE_LABEL]}/{container['name']}")
    return found


def refuse_unrunnable(spec: JobSpec, namespace_labels: Mapping[str, str]) -> None:
    """Raises `JobCreateError` when the namespace's Pod Security admission would refuse the
    job's pods (every pod is created later, by the master: the job would hang, not fail)."""
    if namespace_labels.get(PSS_ENFORCE_LABEL) != "restricted":
        return
    root = may_run_as_root(spec)
    if root:
        raise JobCreateError(
            f"namespace {spec.namespace} enforces the restricted Pod Security Standard "
            f"({PSS_ENFORCE_LABEL}=restricted), which refuses pods that may run as root, and "
            f"{', '.join(root[:3])} run as their images' users: submit with --restricted "
            "(PaddleJob spec.securityProfile: restricted; the image must work as --run-as-user), "
            "or to a namespace that does not enforce it", status=422)


def check_namespace(api: Any, spec: JobSpec, *, rights: str | None = None) -> None:
    """`refuse_unrunnable` with the namespace's labels, where the caller may read them (a
    Namespace is cluster-wide: a submitter with a namespaced Role alone may not)."""
    from kubernetes import client

    found = call(client.CoreV1Api(api).read_namespace, spec.namespace, verb="get",
                 resource="namespaces", namespace=spec.namespace, name=spec.namespace,
                 tolerate=(403, 404), rights=rights)
    if found is not None:
        refuse_unrunnable(spec, (to_dict(api, found).get("metadata") or {}).get("labels") or {})


def create_job(api: Any, *, spec: JobSpec, objects: list[dict[str, Any]],
               rights: str | None = None) -> None:
    """Creates the ConfigMaps, then the Deployment, then its Service; a name in use is refused,
    and so is a job whose pods the namespace's Pod Security admission would refuse. A job for a
    Kueue queue is refused: only the operator runs one (as a PaddleJob)."""
    from kubernetes import client

    from paddlecloud.backends.k8s.client import CLI_MANAGER, applied
    from paddlecloud.tls import issue_master_certificate

    if spec.local_queue:
        raise JobSpecError(
            f"job {spec.name} names the Kueue queue {spec.local_queue!r}: a queued job is a "
            "PaddleJob `paddlecloud operator` runs once Kueue admits it, not created directly "
            "(docs/kubernetes.md, Kueue)")

    check_namespace(api, spec, rights=rights)
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    ns = spec.namespace
    created: list[str] = []
    made: dict[str, Any] = {}
    # The master's TLS certificate, by a CA made for this job alone and forgotten at once: the
    # CA certificate goes on the Deployment (public), the master's key into the Secret only.
    certificate = issue_master_certificate(manifests.master_certificate_hosts(spec.name, ns), job=spec.name)

    def create(patch: Callable[..., Any], body: dict[str, Any], resource: str, *,
               read: Callable[..., Any] | None = None) -> Any:
        """The object, created by a server-side apply of `paddlecloud-cli`. With `read`, a name
        in use is refused (read first: an apply would merge into the object of that name);
        without, one left by an earlier try is taken over (what it held is stated anew)."""
        name = body["metadata"]["name"]
        if read is not None and call(read, name, ns, verb="get", resource=resource, namespace=ns,
                                     name=name, tolerate=(404,), rights=rights) is not None:
            raise JobCreateError(
                f"job {spec.name} already exists in namespace {ns} ({resource} {name} exists)",
                status=409)
        return call(patch, name, ns, body, verb="apply", resource=resource, namespace=ns,
                    name=name, rights=rights, **applied(CLI_MANAGER))

    configmaps = [o for o in objects if o["kind"] == "ConfigMap"]
    try:
        for cm in configmaps:
            create(core.patch_namespaced_config_map, cm, "configmaps",
                   read=core.read_namespaced_config_map)
            created.append(cm["metadata"]["name"])
        deployment = manifests.publish_master_ca(
            next(o for o in objects if o["kind"] == "Deployment"), certificate.ca)
        made = to_dict(api, create(apps.patch_namespaced_deployment, deployment, "deployments",
                                   read=apps.read_namespaced_deployment))
        # Only now, the name ours: an etcd user of that name is no running job's (a leftover
        # of one deleted without etcd's root credentials), so a new password harms nobody.
        etcd_user = provision_etcd_user(spec)
    except JobCreateError:
        # leave nothing behind of a job that was not created (its master cannot log in)
        if made:
            name = deployment["metadata"]["name"]
            call(apps.delete_namespaced_deployment, name, ns, verb="delete", resource="deployments",
                 namespace=ns, name=name, tolerate=(404,), rights=rights)
        for cm in created:
            call(core.delete_namespaced_config_map, cm, ns, verb="delete", resource="configmaps",
                 namespace=ns, name=cm, tolerate=(404,), rights=rights)
        raise
    uid = (made.get("metadata") or {}).get("uid")
    if not uid:
        raise JobCreateError(f"the API server gave Deployment {deployment['metadata']['name']} no uid")
    owner = manifests.owner_reference(spec.name, uid)
    create(core.patch_namespaced_service, manifests.master_service(spec, owner), "services")
    # The master's own account and rights (its pods start once the ServiceAccount exists).
    rbac = client.RbacAuthorizationV1Api(api)
    appliers = {"ServiceAccount": (core.patch_namespaced_service_account, "serviceaccounts"),
                "Role": (rbac.patch_namespaced_role, "roles"),
                "RoleBinding": (rbac.patch_namespaced_role_binding, "rolebindings")}
    for obj in manifests.master_rbac(spec, owner):
        fn, resource = appliers[obj["kind"]]
        create(fn, obj, resource)
    # The job's tokens and the master's key, made here and nowhere stored but in the Secret
    # (the master's pods wait for it to mount); owned, so it goes with the job. A Secret of
    # that name left by an earlier try holds another CA's certificate: stated anew.
    from paddlecloud.auth import JobTokens

    create(core.patch_namespaced_secret,
           manifests.tokens_secret(spec, JobTokens.generate().as_mapping(), owner,
                                   certificate=certificate), "secrets")
    if etcd_user is not None:  # its password is new: one left by an earlier try is replaced
        create(core.patch_namespaced_secret,
               manifests.etcd_user_secret(spec, user=etcd_user.name, password=etcd_user.password,
                                          owner=owner), "secrets")
    networking = client.NetworkingV1Api(api)
    for policy in manifests.network_policies(spec, owner):
        create(networking.patch_namespaced_network_policy, policy, "networkpolicies")
    for cm in configmaps:  # owned too, so deleting the Deployment alone removes the whole job;
        # the whole ConfigMap again: an apply states every field its manager keeps
        owned = {**cm, "metadata": {**cm["metadata"], "ownerReferences": [owner]}}
        create(core.patch_namespaced_config_map, owned, "configmaps")


ETCD_TIMEOUT_S = 5.0


def provision_etcd_user(spec: JobSpec) -> JobEtcdUser | None:
    """The job's own etcd user (`paddlecloud.etcd_users`), made with this process's etcd
    credentials; None where it has no etcd user (etcd without auth)."""
    import asyncio

    from paddlecloud.etcd_users import provision_job_user

    try:
        return asyncio.run(provision_job_user(spec.etcd_endpoints, namespace=spec.namespace,
                                              job=spec.name, timeout=ETCD_TIMEOUT_S))
    except Exception as error:
        raise JobCreateError(f"could not make the etcd user of job {spec.name} at "
                             f"{spec.etcd_endpoints}: {error}") from None


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


def master_ca(annotations: Mapping[str, str] | None) -> bytes | None:
    """The job's CA certificate from its master Deployment's annotations, None when they carry
    none (a job submitted before certificates were issued at submit)."""
    ca = (annotations or {}).get(manifests.MASTER_CA_ANNOTATION)
    return ca.encode("ascii") if ca else None


def fetch_master_status(address: str, *, timeout: float, token: str | None = None,
                        ca: bytes | None = None) -> Any:
    """The master's GetStatus answer (`paddlecloud.master_client.ask_master`: retried until
    `timeout`); raises grpc.RpcError when it refused, or did not answer in time (MasterUnavailable).
    Credentials as `paddlecloud.auth.master_credentials` finds them (`ca`: the job's CA,
    `master_ca` of its Deployment)."""
    from paddlecloud.auth import master_credentials
    from paddlecloud.master_client import ask_master

    return ask_master(address, lambda master: master.get_status(), timeout=timeout,
                      credentials=master_credentials(token, ca=ca))


def scale_trainers(address: str, trainers: int, *, timeout: float, token: str | None = None,
                   ca: bytes | None = None, credentials: Any = None) -> Any:
    """Asks the job's master at `address` to set its trainers to `trainers` (its
    `ScaleTrainers` RPC, the operator's; the master's deployer converges): the answer (min,
    max, desired). Credentials as `fetch_master_status`, unless given whole (`credentials`: a
    local job's, from its output directory). Raises as `fetch_master_status`.
    The one scale call of `paddlecloud job scale` and of the autoscaler."""
    from paddlecloud.auth import master_credentials
    from paddlecloud.master_client import ask_master

    return ask_master(address, lambda master: master.scale_trainers(trainers), timeout=timeout,
                      credentials=credentials or master_credentials(token, ca=ca))


# ---- reading and deleting a job (the job server and the Python API) ---------------------------
MASTER_TIMEOUT_S = 2.0
MASTER_SELECTOR = f"{manifests.APP_LABEL}={manifests.APP_NAME},{manifests.ROLE_LABEL}={manifests.MASTER}"


def _clients(api: Any) -> tuple[Any, Any]:
    from kubernetes import client

    return client.CoreV1Api(api), client.AppsV1Api(api)


def list_jobs(api: Any, namespace: str, *, rights: str | None = None,
              paddlejobs: bool = False) -> list[dict[str, Any]]:
    """Every job of a namespace, by name: {name, namespace, phase, created}; with
    `paddlejobs`, also PaddleJobs whose master the operator has not made yet."""
    _, apps = _clients(api)
    found = call(apps.list_namespaced_deployment, namespace, label_selector=MASTER_SELECTOR,
                 verb="list", resource="deployments", namespace=namespace, rights=rights)
    out = []
    for item in found.items or []:
        name = (item.metadata.labels or {}).get(manifests.JOB_LABEL)
        if name:
            out.append({"name": name, "namespace": namespace,
                        "phase": (item.metadata.annotations or {}).get(
                            manifests.PHASE_ANNOTATION, Phase.PENDING.value),
                        "created": str(item.metadata.creation_timestamp or "")})
    named = {j["name"] for j in out}
    for pdj in _paddlejobs(api, namespace, rights=rights) if paddlejobs else ():  # before the operator made the master
        meta = pdj.get("metadata") or {}
        if meta.get("name") and meta["name"] not in named:
            out.append({"name": meta["name"], "namespace": namespace,
                        "phase": (pdj.get("status") or {}).get("phase") or Phase.PENDING.value,
                        "created": str(meta.get("creationTimestamp") or "")})
    return sorted(out, key=lambda j: j["name"])


def job_status(api: Any, *, namespace: str, name: str, rights: str | None = None,
               paddlejobs: bool = False) -> dict[str, Any] | None:
    """Phase, pods per role and the master's progress; None when there is no such job."""
    core, apps = _clients(api)
    deployment = call(apps.read_namespaced_deployment, manifests.master_name(name), namespace,
                      verb="get", resource="deployments", namespace=namespace,
                      name=manifests.master_name(name), tolerate=(404,), rights=rights)
    if deployment is None:
        if not paddlejobs:
            return None
        pdj = next((p for p in _paddlejobs(api, namespace, rights=rights)
                    if (p.get("metadata") or {}).get("name") == name), None)
        if pdj is None:
            return None
        return {"name": name, "namespace": namespace,
                "phase": (pdj.get("status") or {}).get("phase") or Phase.PENDING.value, "reason": "",
                "pods": {role: {} for role in ROLES}, "progress": None}
    pods = call(core.list_namespaced_pod, namespace, label_selector=manifests.label_selector(name),
                verb="list", resource="pods", namespace=namespace, rights=rights)
    annotations = deployment.metadata.annotations or {}
    phase, reason = shown_phase(annotations, replicas=deployment.spec.replicas)
    return {"name": name, "namespace": namespace, "phase": phase, "reason": reason,
            "pods": pod_counts(pods.items or [], name),
            "progress": master_progress(namespace, name, ca=master_ca(annotations),
                                        token=viewer_token(api, namespace=namespace, name=name,
                                                           rights=rights))}


def shown_phase(annotations: Mapping[str, str], *, replicas: int | None) -> tuple[str, str]:
    """The job's phase and its reason from its master Deployment: the master's own, or
    Suspended while the operator holds the job (its master stopped, to resume at the
    checkpoint: docs/kubernetes.md, "spec.suspend")."""
    phase = annotations.get(manifests.PHASE_ANNOTATION, Phase.PENDING.value)
    held = replicas == 0 and annotations.get(manifests.RESUME_ANNOTATION) == manifests.RESUME_PENDING
    if held and phase not in {p.value for p in Phase if p.terminal}:
        return "Suspended", "suspended (spec.suspend or Kueue): it resumes at its checkpoint"
    return phase, annotations.get(manifests.PHASE_REASON_ANNOTATION, "")


def viewer_token(api: Any, *, namespace: str, name: str, rights: str | None = None) -> str | None:
    """The job's viewer token from its Secret `NAME-tokens`; None when there is none or the
    caller may not read it (its master then answers UNAUTHENTICATED: no progress shown)."""
    import base64

    from kubernetes import client

    secret_name = manifests.tokens_secret_name(name)
    secret = call(client.CoreV1Api(api).read_namespaced_secret, secret_name, namespace,
                  verb="get", resource="secrets", namespace=namespace, name=secret_name,
                  tolerate=(403, 404), rights=rights)
    viewer = ((secret.data or {}) if secret is not None else {}).get("viewer")
    return base64.b64decode(viewer).decode().strip() if viewer else None


def master_progress(namespace: str, name: str, *, ca: bytes | None = None,
                    token: str | None = None) -> dict[str, int] | None:
    """The master's epoch progress through its Service (TLS checked against `ca`, `token` the
    job's viewer token); None when it does not answer."""
    import grpc

    try:
        reply = fetch_master_status(manifests.master_address(name, namespace),
                                    timeout=MASTER_TIMEOUT_S, token=token, ca=ca)
    except grpc.RpcError as error:
        logger.info("master of %s/%s unreachable: %s", namespace, name, error)
        return None
    if not reply.has_dataset:
        return None
    return {"epoch": reply.current_epoch, "epochs": reply.num_epochs,
            "tasks_done": reply.counts.done, "tasks": reply.num_tasks,
            "trainers_alive": reply.trainers_alive}


class JobStateLeft(JobCreateError):
    """The job's objects went but its etcd keys could not be cleared (its etcd did not answer):
    the spec ConfigMap stays, unowned, so the same delete can be tried again (and a job
    submitted under that name meanwhile is refused rather than reading the old keys)."""

    def __init__(self, message: str, *, deleted: list[str]) -> None:
        super().__init__(message, status=503)
        self.deleted = deleted


def delete_job(api: Any, *, namespace: str, name: str, rights: str | None = None,
               paddlejobs: bool = False, etcd_endpoints: str | None = None,
               on_cleared: Callable[[int], None] | None = None) -> list[str]:
    """Deletes the master (and so what it owns), the ConfigMaps and the etcd keys (at
    `etcd_endpoints`, default the job spec's; `on_cleared` hears how many went); returns what
    went, [] when there was no such job. Raises `JobStateLeft` when that etcd does not answer: everything but the spec
    ConfigMap is gone then, and a retry finishes the delete."""
    from kubernetes import client

    core, apps = _clients(api)
    spec_name = manifests.spec_configmap_name(name)
    spec_cm = call(core.read_namespaced_config_map, spec_name, namespace, verb="get",
                   resource="configmaps", namespace=namespace, tolerate=(404,), rights=rights)
    spec_yaml = (spec_cm.data or {}).get(manifests.SPEC_KEY) if spec_cm is not None else None
    spec = _readable_spec(spec_yaml, namespace=namespace, name=name)
    if spec is not None:  # kept until the keys are gone: the Deployment would take it along
        _release_spec_configmap(api, spec, rights=rights)
    options = client.V1DeleteOptions(propagation_policy="Background")
    deleted = []
    # the PaddleJob first: else its operator would create the master again
    if paddlejobs and call(_custom(api).delete_namespaced_custom_object, PADDLEJOB_GROUP, PADDLEJOB_VERSION,
            namespace, PADDLEJOB_PLURAL, name, verb="delete", resource=PADDLEJOB_PLURAL,
            namespace=namespace, name=name, tolerate=(404,), rights=rights) is not None:
        deleted.append(f"{PADDLEJOB_PLURAL}/{name}")
    doomed = [("deployments", apps.delete_namespaced_deployment, manifests.master_name(name)),
              ("configmaps", core.delete_namespaced_config_map, manifests.package_configmap_name(name))]
    deleted += _delete_each(doomed, namespace, options, rights=rights)
    if spec is not None or (etcd_endpoints and deleted):
        count = _clear_etcd(etcd_endpoints or spec.etcd_endpoints, namespace=namespace,
                            name=name, deleted=deleted)
        if on_cleared is not None:
            on_cleared(count)
    return deleted + _delete_each([("configmaps", core.delete_namespaced_config_map, spec_name)],
                                  namespace, options, rights=rights)


def _delete_each(objects: list[tuple[str, Callable[..., Any], str]], namespace: str,
                 options: Any, *, rights: str | None) -> list[str]:
    """Deletes each (resource, delete function, name); returns `resource/name` of those there."""
    deleted = []
    for resource, fn, obj in objects:
        if call(fn, obj, namespace, body=options, verb="delete", resource=resource,
                namespace=namespace, name=obj, tolerate=(404,), rights=rights) is not None:
            deleted.append(f"{resource}/{obj}")
    return deleted


def _readable_spec(spec_yaml: str | None, *, namespace: str, name: str) -> JobSpec | None:
    if not spec_yaml:
        return None
    try:
        return JobSpec.from_yaml(spec_yaml)
    except JobSpecError as error:  # no etcd to clear that we know of: the objects still go
        logger.warning("cannot read the job spec of %s/%s (its etcd keys stay): %s",
                       namespace, name, error)
        return None


def _release_spec_configmap(api: Any, spec: JobSpec, *, rights: str | None) -> None:
    """The spec ConfigMap stated anew without its owner (the master Deployment), by the
    manager that made it: deleting the Deployment then leaves it for the etcd step."""
    from kubernetes import client

    from paddlecloud.backends.k8s.client import CLI_MANAGER, applied

    body = manifests.spec_configmap(spec)
    name = body["metadata"]["name"]
    call(client.CoreV1Api(api).patch_namespaced_config_map, name, spec.namespace, body,
         verb="apply", resource="configmaps", namespace=spec.namespace, name=name,
         rights=rights, **applied(CLI_MANAGER))


def _clear_etcd(endpoints: str, *, namespace: str, name: str, deleted: list[str]) -> int:
    """The job's keys, and its etcd user, gone (`paddlecloud.etcd_users.forget_job`);
    `JobStateLeft` naming what went and what stays when its etcd does not answer."""
    import asyncio

    from paddlecloud.etcd_users import forget_job

    try:
        count = asyncio.run(forget_job(endpoints, namespace=namespace, job=name, timeout=3.0))
    except Exception as error:  # noqa: BLE001 - whatever etcd said, the keys stay: say so
        went = f" ({', '.join(deleted)} deleted)" if deleted else ""
        raise JobStateLeft(
            f"job {name}'s pods and objects are going{went}, but its etcd keys under "
            f"/paddlecloud/{namespace}/{name}/ at {endpoints} could not be "
            f"cleared ({type(error).__name__}: {str(error)[:200]}): delete the job again once "
            f"that etcd answers (its ConfigMap {manifests.spec_configmap_name(name)} stays "
            "until then, and a job of that name cannot be submitted meanwhile)",
            deleted=deleted) from None
    logger.info("cleared /paddlecloud/%s/%s/ at %s (%d keys)", namespace, name, endpoints, count)
    return count


def pick_pod(api: Any, *, name: str, namespace: str, role: str, index: int,
             rights: str | None = None) -> Any:
    """The pod of `role` number `index` of a job (a trainer id, a pserver index, a master
    number: 0 is the leader), the newest when retried; None when there is none."""
    core, _ = _clients(api)
    pods = call(core.list_namespaced_pod, namespace,
                label_selector=manifests.label_selector(name, role),
                verb="list", resource="pods", namespace=namespace, rights=rights).items or []
    pods = [p for p in pods if (p.metadata.labels or {}).get(manifests.ROLE_LABEL) == role
            and (p.metadata.labels or {}).get(manifests.JOB_LABEL) == name]
    if role == manifests.TRAINER:
        key = manifests.COMPLETION_INDEX_ANNOTATION
        pods = [p for p in pods if (p.metadata.annotations or {}).get(key) == str(index)]
    elif role == manifests.PSERVER:
        pods = [p for p in pods if p.metadata.name == f"{manifests.pserver_name(name)}-{index}"]
    else:
        pods = sorted(pods, key=lambda p: p.metadata.name)
        ready = [p for p in pods if any(c.type == "Ready" and c.status == "True"
                                        for c in (p.status.conditions or []) if p.status)]
        pods = ready or pods  # the leader is the ready master
        pods = pods[index:index + 1]
    if not pods:
        return None
    return max(pods, key=lambda p: str(p.metadata.creation_timestamp or ""))


def pod_log(api: Any, *, name: str, namespace: str, role: str, index: int, tail_lines: int,
            rights: str | None = None) -> str | None:
    """The last `tail_lines` of the log of one pod of a job; None when there is no such pod."""
    core, _ = _clients(api)
    pod = pick_pod(api, name=name, namespace=namespace, role=role, index=index, rights=rights)
    if pod is None:
        return None
    containers = pod.spec.containers if pod.spec else []
    response = call(core.read_namespaced_pod_log, pod.metadata.name, namespace,
                    container=containers[0].name if containers else None, tail_lines=tail_lines,
                    _preload_content=False, verb="get", resource="pods/log", namespace=namespace,
                    name=pod.metadata.name, tolerate=(400, 404), rights=rights)
    return "" if response is None else response.data.decode("utf-8", errors="replace")


# ---- the PaddleJob resource (when the operator's CRD is installed) ------------------------------
PADDLEJOB_GROUP, PADDLEJOB_VERSION = PADDLEJOB_API_VERSION.split("/")
PADDLEJOB_PLURAL = "paddlejobs"


def paddlejob_document(spec: JobSpec) -> dict[str, Any]:
    """The PaddleJob of a spec whose package is in its image (no package ConfigMap): each
    role a pod template running `python3 -m MODULE` with the spec's image, resources and
    env, which the operator's translation (`paddlecloud.paddlejob.translate`) reads back."""
    if spec.package_files:
        raise JobSpecError("a PaddleJob cannot carry a package ConfigMap: build the image first")

    def role(replicas: int, *, name: str, cpu: str, memory: str, gpu: int) -> dict[str, Any]:
        resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory},
                                     "limits": {"memory": memory}}
        if gpu:
            resources["limits"]["nvidia.com/gpu"] = str(gpu)
        container = {"name": name, "image": spec.image, "command": manifests.module_command(spec),
                     "resources": resources}
        if spec.env:
            container["env"] = [{"name": k, "value": v} for k, v in spec.env]
        return {"replicas": replicas, "template": {"spec": {"containers": [container]}}}

    body: dict[str, Any] = {
        "worker": {**role(spec.trainers, name=manifests.TRAINER, cpu=spec.trainer_cpu,
                          memory=spec.trainer_memory, gpu=spec.trainer_gpu),
                   "requests": spec.trainer_range.minimum, "limits": spec.trainer_range.maximum},
        "epochs": spec.epochs,
        "cleanPodPolicy": spec.clean_pod_policy,
        **own_keys(spec),  # paddlecloud's own keys, from the job model
    }
    if spec.pservers:
        body["ps"] = role(spec.pservers, name=manifests.PSERVER, cpu=spec.pserver_cpu,
                          memory=spec.pserver_memory, gpu=0)
    labels = {manifests.APP_LABEL: manifests.APP_NAME, manifests.JOB_LABEL: spec.name}
    if spec.local_queue:
        labels[KUEUE_QUEUE_LABEL] = spec.local_queue
    return {"apiVersion": PADDLEJOB_API_VERSION, "kind": PADDLEJOB_KIND,
            "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": labels},
            "spec": body}


def _custom(api: Any) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(api)


def create_paddlejob(api: Any, *, spec: JobSpec, rights: str | None = None) -> None:
    """Creates the job's PaddleJob; the operator creates its master. A name in use is refused,
    and so is a job whose pods the namespace's Pod Security admission would refuse."""
    check_namespace(api, spec, rights=rights)
    create_paddlejob_document(api, paddlejob_document(spec), rights=rights)


def create_paddlejob_document(api: Any, doc: dict[str, Any], *, rights: str | None = None) -> None:
    """Creates a PaddleJob as written (`job submit --queue -f`); a name in use is refused."""
    from paddlecloud.backends.k8s.client import CLI_MANAGER

    ns, name = doc["metadata"]["namespace"], doc["metadata"]["name"]
    made = call(_custom(api).create_namespaced_custom_object, PADDLEJOB_GROUP, PADDLEJOB_VERSION,
                ns, PADDLEJOB_PLURAL, doc, field_manager=CLI_MANAGER, verb="create",
                resource=PADDLEJOB_PLURAL, namespace=ns, name=name, tolerate=(409,),
                rights=rights)
    if made is None:
        raise JobCreateError(f"job {name} already exists in namespace {ns} "
                             f"(paddlejobs {name} exists)", status=409)


def _paddlejobs(api: Any, namespace: str, *, rights: str | None) -> list[dict[str, Any]]:
    found = call(_custom(api).list_namespaced_custom_object, PADDLEJOB_GROUP, PADDLEJOB_VERSION,
                 namespace, PADDLEJOB_PLURAL, verb="list", resource=PADDLEJOB_PLURAL,
                 namespace=namespace, tolerate=(404,), rights=rights)
    return list((found or {}).get("items") or [])
