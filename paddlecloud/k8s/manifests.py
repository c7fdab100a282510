"""The Kubernetes objects of a paddlecloud job, rendered as plain dicts from a `JobSpec`.

Pure functions, no I/O: the CLI renders what `paddlecloud job submit` creates (the
job-spec and package ConfigMaps, the master Deployment and its Service), the
master's deployer renders what the leading master creates (the pservers'
StatefulSet and headless Service, the trainers' Indexed Job, a Volcano PodGroup),
and `rbac()` renders the namespace-scoped rights the master needs.

Endpoints. Every pserver's endpoint is its stable per-pod DNS name behind the
headless Service, `NAME-ps-<i>.NAME-ps.NS.svc:PORT`, for the life of the job (a
restarted pserver keeps its name, not its IP). A pserver's `POD_IP` is that same
name, built from its own pod name (`$(POD_NAME).NAME-ps.NS.svc`), so its
`POD_IP:PADDLE_PORT` appears exactly once in `PADDLE_PSERVERS_IP_PORT_LIST`, which is
how PaddlePaddle finds its pserver id. The names resolve to the pod IPs, so the
`PodIP` and `Service` intranet modes of paddle-operator are served the same way;
`HostNetwork` runs the pods on the node's network (one per node and role).

What this does NOT guarantee: that the API server accepts a user's raw pod
template from a PaddleJob (it is merged, not validated, here), nor that the image
holds `paddlecloud` (every pod runs `paddlecloud pserver|trainer -- <cmd>`).
"""

from __future__ import annotations

import base64
import copy
import logging
from collections.abc import Mapping
from typing import Any

import yaml

from paddlecloud.checkpoints import checkpoints_dir
from paddlecloud.jobspec import JobSpec, JobSpecError
from paddlecloud.master_flags import master_flags
from paddlecloud.phase import Phase

logger = logging.getLogger(__name__)

Manifest = dict[str, Any]

# Labels and annotations.
APP_LABEL = "app.kubernetes.io/name"
APP_NAME = "paddlecloud"
JOB_LABEL = "paddlecloud.org/job"
ROLE_LABEL = "paddlecloud.org/role"
PHASE_ANNOTATION = "paddlecloud.org/phase"
PHASE_REASON_ANNOTATION = "paddlecloud.org/phase-reason"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"  # set by the StatefulSet controller (k8s >= 1.28)
PODGROUP_ANNOTATION = "scheduling.k8s.io/group-name"

MASTER, PSERVER, TRAINER = "master", "pserver", "trainer"
# A Pod's status.phase values: Kubernetes' words for a pod, not the job's `Phase`.
POD_PHASES = ("Pending", "Running", "Succeeded", "Failed")

# Ports.
MASTER_PORT = 8080
METRICS_PORT = 9090
PADDLE_PORT = 36000  # every pserver and collective trainer listens here (one per pod)
GLOO_HTTP_PORT = 36001  # the gloo HTTP rendezvous store, on pserver 0 or trainer 0

# Names and paths.
SERVICE_ACCOUNT = "paddlecloud-master"
TOKENS_MOUNT = "/var/run/paddlecloud/tokens"  # the job's tokens Secret (paddlecloud.auth)
SPEC_MOUNT = "/etc/paddlecloud"
SPEC_KEY = "job.yaml"
PACKAGE_MOUNT = "/opt/paddlecloud/package"
CONFIGMAP_LIMIT = 1024 * 1024  # what etcd (and so the API server) takes for one object
CONFIGMAP_HEADROOM = 16 * 1024  # room for the object's metadata beside the files

VOLCANO_API_VERSION = "scheduling.volcano.sh/v1beta1"


class PackageTooLarge(JobSpecError):
    """The package does not fit in a ConfigMap; it must be baked into the image."""


# ---- names ----------------------------------------------------------------------------
def master_name(job: str) -> str:
    return f"{job}-master"


def pserver_name(job: str) -> str:
    return f"{job}-ps"


def trainer_name(job: str) -> str:
    return f"{job}-trainer"


def tokens_secret_name(job: str) -> str:
    """The job's tokens (paddlecloud.auth.JobTokens), made by `job submit`."""
    return f"{job}-tokens"


def tokens_secret(spec: JobSpec, tokens: Mapping[str, str], owner: Mapping[str, Any] | None) -> Manifest:
    """The Secret of the job's role tokens: the master mounts all of it (--tokens-dir), its
    trainers and pservers only the trainer token (PADDLE_JOB_TOKEN_FILE)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(spec, name=tokens_secret_name(spec.name), role=MASTER, owner=owner),
        "type": "Opaque",
        "data": {role: base64.b64encode(token.encode()).decode() for role, token in tokens.items()},
    }


def _token_volume(spec: JobSpec, *, only_trainer: bool) -> dict[str, Any]:
    secret: dict[str, Any] = {"secretName": tokens_secret_name(spec.name), "defaultMode": 0o400}
    if only_trainer:
        secret["items"] = [{"key": "trainer", "path": "trainer"}]
    return {"name": "job-tokens", "secret": secret}


ETCD_AUTH_SECRET = "paddlecloud-etcd"  # optional: keys `user`, `password` of etcd's auth


def _etcd_auth_env() -> list[dict[str, Any]]:
    """etcd's user and password from the namespace's Secret, when it has one (masters and
    pservers only: trainers need no etcd credentials)."""
    return [{"name": name, "valueFrom": {"secretKeyRef": {"name": ETCD_AUTH_SECRET, "key": key, "optional": True}}}
            for name, key in (("PADDLE_ETCD_USER", "user"), ("PADDLE_ETCD_PASSWORD", "password"))]


def spec_configmap_name(job: str) -> str:
    return f"{job}-spec"


def package_configmap_name(job: str) -> str:
    return f"{job}-package"


def podgroup_name(job: str) -> str:
    return job


def labels(spec: JobSpec, role: str) -> dict[str, str]:
    return {APP_LABEL: APP_NAME, JOB_LABEL: spec.name, ROLE_LABEL: role}


def selector(spec: JobSpec, role: str) -> dict[str, str]:
    return {JOB_LABEL: spec.name, ROLE_LABEL: role}


def label_selector(job: str, role: str | None = None) -> str:
    """The `?labelSelector=` of a job's objects, or of one role's."""
    parts = [f"{APP_LABEL}={APP_NAME}", f"{JOB_LABEL}={job}"]
    if role is not None:
        parts.append(f"{ROLE_LABEL}={role}")
    return ",".join(parts)


def owner_reference(job: str, uid: str) -> dict[str, Any]:
    """An owner reference to the job's master Deployment: deleting it deletes the object."""
    if not uid:
        raise ValueError(f"no uid for the owner Deployment {master_name(job)!r}")
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": master_name(job),
        "uid": uid,
        "controller": True,
    }


def _metadata(spec: JobSpec, *, name: str, role: str,
              owner: Mapping[str, Any] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": spec.namespace, "labels": labels(spec, role)}
    if owner is not None:
        meta["ownerReferences"] = [dict(owner)]
    return meta


# ---- endpoints --------------------------------------------------------------------------
def pserver_host(spec: JobSpec, index: int) -> str:
    name = pserver_name(spec.name)
    return f"{name}-{index}.{name}.{spec.namespace}.svc"


def pserver_endpoints(spec: JobSpec) -> list[str]:
    return [f"{pserver_host(spec, i)}:{PADDLE_PORT}" for i in range(spec.pservers)]


def trainer_host(spec: JobSpec, index: int | str) -> str:
    name = trainer_name(spec.name)
    return f"{name}-{index}.{name}.{spec.namespace}.svc"


def trainer_endpoints(spec: JobSpec) -> list[str]:
    return [f"{trainer_host(spec, i)}:{PADDLE_PORT}" for i in range(spec.trainers)]


def master_address(job: str, namespace: str) -> str:
    """The master Service's address: it routes to the ready master, the leader."""
    return f"{master_name(job)}.{namespace}.svc:{MASTER_PORT}"


def master_endpoint(spec: JobSpec) -> str:
    return master_address(spec.name, spec.namespace)


def needs_trainer_service(spec: JobSpec) -> bool:
    """Trainers that talk to each other (collective, or gloo) need stable names."""
    return spec.collective or spec.with_gloo > 0


def gloo_http_endpoint(spec: JobSpec) -> str:
    host = pserver_host(spec, 0) if spec.pservers else trainer_host(spec, 0)
    return f"{host}:{GLOO_HTTP_PORT}"


# ---- environment (DESIGN.md section 8) ------------------------------------------------------
def _value(name: str, value: str | int) -> dict[str, Any]:
    return {"name": name, "value": str(value)}


def _field(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _common_env(spec: JobSpec, role: str) -> list[dict[str, Any]]:
    env = [
        _value("PADDLE_JOB_NAME", spec.name),
        _value("PADDLE_NAMESPACE", spec.namespace),
        _value("PADDLE_ETCD_ENDPOINTS", spec.etcd_endpoints),
        _value("PADDLE_MASTER_ENDPOINT", master_endpoint(spec)),
        _value("PADDLE_JOB_TOKEN_FILE", f"{TOKENS_MOUNT}/trainer"),
        _value("PADDLE_TRAINERS_NUM", spec.trainers),
        _value("PADDLE_PSERVERS_NUM", spec.pservers),
        _value("PADDLE_PORT", PADDLE_PORT),
    ]
    if spec.pservers:
        env.append(_value("PADDLE_PSERVERS_IP_PORT_LIST", ",".join(pserver_endpoints(spec))))
    if spec.with_gloo and (role == TRAINER or spec.with_gloo == 2):
        env += [
            _value("PADDLE_WITH_GLOO", spec.with_gloo),
            _value("PADDLE_GLOO_RENDEZVOUS", 3),  # 3: the HTTP store
            _value("PADDLE_GLOO_HTTP_ENDPOINT", gloo_http_endpoint(spec)),
        ]
    if spec.output:
        env.append(_value("PADDLECLOUD_OUTPUT", spec.output))
    user = dict(spec.env)
    if spec.package_files:
        path = PACKAGE_MOUNT + (":" + user.pop("PYTHONPATH") if "PYTHONPATH" in user else "")
        env.append(_value("PYTHONPATH", path))
    env += [_value(k, v) for k, v in user.items()]
    return env


def pserver_env(spec: JobSpec) -> list[dict[str, Any]]:
    """A pserver's POD_IP is its stable DNS name, so POD_IP:PADDLE_PORT is in the list once."""
    return [
        _value("TRAINING_ROLE", "PSERVER"),
        _value("PADDLE_TRAINING_ROLE", "PSERVER"),
        _field("POD_NAME", "metadata.name"),
        _field("PADDLE_PSERVER_ID", f"metadata.labels['{POD_INDEX_LABEL}']"),
        _value("POD_IP", f"$(POD_NAME).{pserver_name(spec.name)}.{spec.namespace}.svc"),
        *_common_env(spec, PSERVER),
        *_etcd_auth_env(),
    ]


def trainer_env(spec: JobSpec) -> list[dict[str, Any]]:
    env = [
        _value("TRAINING_ROLE", "TRAINER"),
        _value("PADDLE_TRAINING_ROLE", "TRAINER"),
        _field("PADDLE_TRAINER_ID", f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"),
        _field("POD_NAME", "metadata.name"),
        _field("POD_IP", "status.podIP"),
    ]
    if needs_trainer_service(spec):
        env += [
            _value("PADDLE_TRAINER_ENDPOINTS", ",".join(trainer_endpoints(spec))),
            _value("PADDLE_CURRENT_ENDPOINT", f"{trainer_host(spec, '$(PADDLE_TRAINER_ID)')}:{PADDLE_PORT}"),
        ]
    return env + _common_env(spec, TRAINER)


# ---- pods -------------------------------------------------------------------------------------
def _resources(cpu: str, memory: str, gpu: int) -> dict[str, Any]:
    limits: dict[str, str] = {"memory": memory}
    if gpu:
        limits["nvidia.com/gpu"] = str(gpu)
    return {"requests": {"cpu": cpu, "memory": memory}, "limits": limits}


def _wants_gpu(container: Mapping[str, Any]) -> bool:
    resources = container.get("resources") or {}
    return any("nvidia.com/gpu" in (resources.get(k) or {}) for k in ("limits", "requests"))


def _command(spec: JobSpec, *, role: str, container: Mapping[str, Any], where: str) -> list[str]:
    """`paddlecloud <role> -- <program>`: the agent registers/supervises the program."""
    program = [*(container.get("command") or []), *(container.get("args") or [])]
    if program[:2] == ["paddlecloud", role]:
        return [str(p) for p in program]
    if not program:
        if not spec.module:
            raise JobSpecError(
                f"{where}.containers[0] has no command: paddlecloud runs the program under its "
                f"{role} agent, so give `command:` (or --module)"
            )
        program = ["python", "-m", spec.module]
    return ["paddlecloud", role, "--", *[str(p) for p in program]]


def _merge_env(*, where: str, ours: list[dict[str, Any]], theirs: list[Any]) -> list[dict[str, Any]]:
    mine = {e["name"] for e in ours}
    for entry in theirs:
        if entry.get("name") in mine:
            raise JobSpecError(
                f"{where}.containers[0].env sets {entry.get('name')}, which paddlecloud sets itself "
                "(DESIGN.md section 8): remove it"
            )
    return [*ours, *copy.deepcopy(list(theirs))]


def _add_port(container: dict[str, Any], *, name: str, port: int) -> None:
    ports = container.setdefault("ports", [])
    if any(p.get("containerPort") == port or p.get("name") == name for p in ports):
        return
    ports.append({"name": name, "containerPort": port})


def _pod_template(spec: JobSpec, role: str, *, template: Mapping[str, Any] | None,
                  env: list[dict[str, Any]]) -> dict[str, Any]:
    """A pod template: the PaddleJob's (merged) or one built from the spec's resources."""
    where = f"spec.{'ps' if role == PSERVER else 'worker'}.template.spec"
    tpl = copy.deepcopy(dict(template)) if template is not None else {}
    meta = tpl.setdefault("metadata", {})
    for key in ("name", "namespace", "generateName", "ownerReferences"):
        meta.pop(key, None)
    meta["labels"] = {**(meta.get("labels") or {}), **labels(spec, role)}
    pod = tpl.setdefault("spec", {})
    if template is not None:
        containers = pod["containers"]
        container = containers[0]
    else:
        if role == PSERVER:
            resources = _resources(spec.pserver_cpu, spec.pserver_memory, 0)
        else:
            resources = _resources(spec.trainer_cpu, spec.trainer_memory, spec.trainer_gpu)
        container = {"name": role, "image": spec.image, "resources": resources}
        containers = pod["containers"] = [container]
    container["command"] = _command(spec, role=role, container=container, where=where)
    container.pop("args", None)
    container["env"] = _merge_env(where=where, ours=env, theirs=container.get("env") or [])
    _add_port(container, name="paddle", port=PADDLE_PORT)
    if spec.with_gloo and (role == TRAINER or spec.with_gloo == 2):
        _add_port(container, name="gloo-http", port=GLOO_HTTP_PORT)

    mounts = container.setdefault("volumeMounts", [])
    volumes = pod.setdefault("volumes", [])
    if spec.package_files:
        volumes.append({"name": "package", "configMap": {
            "name": package_configmap_name(spec.name),
            "items": [{"key": package_key(p), "path": p} for p in spec.package_files],
        }})
        mounts.append({"name": "package", "mountPath": PACKAGE_MOUNT, "readOnly": True})
    volumes.append(_token_volume(spec, only_trainer=True))
    mounts.append({"name": "job-tokens", "mountPath": TOKENS_MOUNT, "readOnly": True})
    if spec.data_volume is not None and role == TRAINER:
        volumes.append({"name": "data", "persistentVolumeClaim": {"claimName": spec.data_volume.claim}})
        mounts.append({"name": "data", "mountPath": spec.data_volume.mount_path})
    if _wants_gpu(container) and not any(m.get("mountPath") == "/dev/shm" for m in mounts):
        # NCCL needs more shared memory than a container's default 64 MiB
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    if not mounts:
        container.pop("volumeMounts")
    if not volumes:
        pod.pop("volumes")

    pod.setdefault("automountServiceAccountToken", False)
    if spec.scheduler_name:
        pod["schedulerName"] = spec.scheduler_name
    if spec.uses_volcano:
        meta["annotations"] = {**(meta.get("annotations") or {}),
                               PODGROUP_ANNOTATION: podgroup_name(spec.name)}
    if spec.intranet == "HostNetwork":
        pod["hostNetwork"] = True
        pod["dnsPolicy"] = "ClusterFirstWithHostNet"
        # one pod of a role per node: they all listen on PADDLE_PORT
        pod.setdefault("affinity", {})["podAntiAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": {"matchLabels": selector(spec, role)},
                "topologyKey": "kubernetes.io/hostname",
            }],
        }
    return tpl


# ---- the objects the master creates --------------------------------------------------------
def _headless_service(spec: JobSpec, *, name: str, role: str, owner: Mapping[str, Any] | None,
                      gloo: bool) -> Manifest:
    ports = [{"name": "paddle", "port": PADDLE_PORT, "targetPort": PADDLE_PORT}]
    if gloo:
        ports.append({"name": "gloo-http", "port": GLOO_HTTP_PORT, "targetPort": GLOO_HTTP_PORT})
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(spec, name=name, role=role, owner=owner),
        "spec": {
            "clusterIP": "None",
            # peers must resolve each other before they are ready
            "publishNotReadyAddresses": True,
            "selector": selector(spec, role),
            "ports": ports,
        },
    }


def pserver_service(spec: JobSpec, owner: Mapping[str, Any] | None) -> Manifest:
    """The headless Service that gives every pserver its stable DNS name."""
    return _headless_service(spec, name=pserver_name(spec.name), role=PSERVER, owner=owner,
                             gloo=spec.with_gloo > 0 and spec.pservers > 0)


def pserver_statefulset(spec: JobSpec, owner: Mapping[str, Any] | None) -> Manifest:
    """The pservers: the ordinal is the pserver index, each runs `paddlecloud pserver -- <cmd>`."""
    template = _pod_template(spec, PSERVER, template=spec.ps_template, env=pserver_env(spec))
    template["spec"]["restartPolicy"] = "Always"  # the only policy a StatefulSet takes
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _metadata(spec, name=pserver_name(spec.name), role=PSERVER, owner=owner),
        "spec": {
            "serviceName": pserver_name(spec.name),
            "replicas": spec.pservers,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector(spec, PSERVER)},
            "template": template,
        },
    }


def trainer_service(spec: JobSpec, owner: Mapping[str, Any] | None) -> Manifest:
    """The headless Service that gives every trainer its stable DNS name (collective/gloo)."""
    return _headless_service(spec, name=trainer_name(spec.name), role=TRAINER, owner=owner,
                             gloo=spec.with_gloo > 0 and spec.pservers == 0)


def trainer_backoff_limit(spec: JobSpec) -> int:
    """Generous: trainers rejoin after a failure, so only a crash loop should end the Job."""
    return max(10, 3 * spec.trainers)


def trainer_job(spec: JobSpec, owner: Mapping[str, Any] | None) -> Manifest:
    """The trainers: an Indexed Job whose completion index is `PADDLE_TRAINER_ID`."""
    template = _pod_template(spec, TRAINER, template=spec.worker_template, env=trainer_env(spec))
    pod = template["spec"]
    if pod.get("restartPolicy") not in ("OnFailure", "Never"):
        pod["restartPolicy"] = "OnFailure"
    if needs_trainer_service(spec):
        pod["subdomain"] = trainer_name(spec.name)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(spec, name=trainer_name(spec.name), role=TRAINER, owner=owner),
        "spec": {
            "completionMode": "Indexed",
            "completions": spec.trainers,
            "parallelism": spec.trainers,
            "backoffLimit": trainer_backoff_limit(spec),
            "template": template,
        },
    }


def podgroup(spec: JobSpec, owner: Mapping[str, Any] | None, *, min_member: int | None = None) -> Manifest:
    """A Volcano PodGroup for gang scheduling; `min_member` defaults to pservers + trainers."""
    body: dict[str, Any] = {"minMember": spec.pservers + spec.trainers if min_member is None else min_member}
    if spec.queue:
        body["queue"] = spec.queue
    if spec.priority_class:
        body["priorityClassName"] = spec.priority_class
    if spec.min_resources:
        body["minResources"] = dict(spec.min_resources)
    return {
        "apiVersion": VOLCANO_API_VERSION,
        "kind": "PodGroup",
        "metadata": _metadata(spec, name=podgroup_name(spec.name), role=MASTER, owner=owner),
        "spec": body,
    }


def master_objects(spec: JobSpec, owner: Mapping[str, Any] | None) -> list[Manifest]:
    """Everything the leading master creates, in creation order (for --dry-run and tests)."""
    out: list[Manifest] = []
    if spec.uses_volcano:
        out.append(podgroup(spec, owner))
    if spec.pservers:
        out += [pserver_service(spec, owner), pserver_statefulset(spec, owner)]
    if needs_trainer_service(spec):
        out.append(trainer_service(spec, owner))
    out.append(trainer_job(spec, owner))
    return out


# ---- the objects `paddlecloud job submit` creates ---------------------------------------------
def spec_configmap(spec: JobSpec) -> Manifest:
    """The job spec the master reads with `--job-spec`."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(spec, name=spec_configmap_name(spec.name), role=MASTER, owner=None),
        "data": {SPEC_KEY: spec.to_yaml()},
    }


def package_key(path: str) -> str:
    """The ConfigMap key of a package file: its relative path with '/' as '__'."""
    key = path.replace("/", "__")
    if not key or key in (".", "..") or key.startswith("..") or not all(
        c.isascii() and (c.isalnum() or c in "-._") for c in key
    ):
        raise JobSpecError(
            f"package file {path!r} cannot be a ConfigMap key: use letters, digits, '-', '_' and "
            "'.' in file names, or bake the package into the image"
        )
    return key


def package_configmap(spec: JobSpec, contents: Mapping[str, bytes]) -> Manifest:
    """The user's package directory, file by file; text as `data`, the rest as `binaryData`.

    Raises `PackageTooLarge` when it would not fit in one ConfigMap (1 MiB).
    """
    data: dict[str, str] = {}
    binary: dict[str, str] = {}
    keys: dict[str, str] = {}
    size = 0
    for path in sorted(contents):
        key = package_key(path)
        if key in keys:
            raise JobSpecError(f"package files {keys[key]!r} and {path!r} map to one ConfigMap key")
        keys[key] = path
        raw = contents[path]
        try:
            data[key] = raw.decode("utf-8")
            size += len(raw)
        except UnicodeDecodeError:
            binary[key] = base64.b64encode(raw).decode("ascii")
            size += len(binary[key])
        size += len(key)
    limit = CONFIGMAP_LIMIT - CONFIGMAP_HEADROOM
    if size > limit:
        raise PackageTooLarge(
            f"package {spec.package_path or '(package)'} is {size} bytes as a ConfigMap; a "
            f"ConfigMap holds at most {limit} bytes of files (1 MiB in all): bake the package "
            "into the image instead (COPY it in deploy/Dockerfile, pip install it) and submit "
            "with --module only"
        )
    manifest: Manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(spec, name=package_configmap_name(spec.name), role=MASTER, owner=None),
    }
    if data:
        manifest["data"] = data
    if binary:
        manifest["binaryData"] = binary
    return manifest


def master_command(spec: JobSpec) -> list[str]:
    flags = master_flags(
        job=spec.name, namespace=spec.namespace, etcd_endpoints=spec.etcd_endpoints,
        port=MASTER_PORT, advertise=f"$(POD_IP):{MASTER_PORT}", metrics_port=METRICS_PORT,
        inputs=spec.inputs or (), epochs=spec.epochs,
        # a job started again on the same output resumes after its checkpoint
        resume_from=checkpoints_dir(spec.output) if spec.output else None, tokens_dir=TOKENS_MOUNT,
        extra=("--deployer", "kubernetes", "--job-spec", f"{SPEC_MOUNT}/{SPEC_KEY}"),
    )
    return ["paddlecloud", "master", *flags]


def master_deployment(spec: JobSpec) -> Manifest:
    """Two masters campaigning in etcd; the root owner of everything else of the job.

    Readiness is the gRPC health check, SERVING only on the leader, so the Service
    routes to the leader; liveness is a TCP check, so a standby (NOT_SERVING) lives.
    """
    mounts = [{"name": "job-spec", "mountPath": SPEC_MOUNT, "readOnly": True},
              {"name": "job-tokens", "mountPath": TOKENS_MOUNT, "readOnly": True}]
    volumes: list[dict[str, Any]] = [
        {"name": "job-spec", "configMap": {"name": spec_configmap_name(spec.name)}},
        _token_volume(spec, only_trainer=False),
    ]
    if spec.data_volume is not None:
        mounts.append({"name": "data", "mountPath": spec.data_volume.mount_path, "readOnly": True})
        volumes.append({"name": "data", "persistentVolumeClaim": {
            "claimName": spec.data_volume.claim, "readOnly": True}})
    container = {
        "name": "master",
        "image": spec.image,
        "command": master_command(spec),
        "env": [
            _value("PADDLE_JOB_NAME", spec.name),
            _value("PADDLE_NAMESPACE", spec.namespace),
            _value("PADDLE_ETCD_ENDPOINTS", spec.etcd_endpoints),
            _field("POD_NAME", "metadata.name"),
            _field("POD_IP", "status.podIP"),
            *_etcd_auth_env(),
        ],
        "ports": [
            {"name": "grpc", "containerPort": MASTER_PORT},
            {"name": "metrics", "containerPort": METRICS_PORT},
        ],
        "readinessProbe": {"grpc": {"port": MASTER_PORT}, "periodSeconds": 2, "failureThreshold": 1},
        "livenessProbe": {"tcpSocket": {"port": MASTER_PORT}, "initialDelaySeconds": 10,
                          "periodSeconds": 10, "failureThreshold": 6},
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "volumeMounts": mounts,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            **_metadata(spec, name=master_name(spec.name), role=MASTER, owner=None),
            "annotations": {PHASE_ANNOTATION: Phase.PENDING.value},
        },
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": selector(spec, MASTER)},
            "template": {
                "metadata": {"labels": labels(spec, MASTER)},
                "spec": {
                    "serviceAccountName": SERVICE_ACCOUNT,
                    "containers": [container],
                    "volumes": volumes,
                    "affinity": {"podAntiAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [{
                            "weight": 100,
                            "podAffinityTerm": {
                                "labelSelector": {"matchLabels": selector(spec, MASTER)},
                                "topologyKey": "kubernetes.io/hostname",
                            },
                        }],
                    }},
                },
            },
        },
    }


def master_service(spec: JobSpec, owner: Mapping[str, Any] | None) -> Manifest:
    """The master's stable address; only the ready master (the leader) is behind it."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(spec, name=master_name(spec.name), role=MASTER, owner=owner),
        "spec": {
            "selector": selector(spec, MASTER),
            "ports": [
                {"name": "grpc", "port": MASTER_PORT, "targetPort": MASTER_PORT, "appProtocol": "grpc"},
                {"name": "metrics", "port": METRICS_PORT, "targetPort": METRICS_PORT},
            ],
        },
    }


def submit_objects(spec: JobSpec, package: Mapping[str, bytes] | None = None,
                   *, owner: Mapping[str, Any] | None = None) -> list[Manifest]:
    """What `paddlecloud job submit` creates, in order (the Service is owned once the
    Deployment exists, so `owner` is None in a dry run)."""
    out = [spec_configmap(spec)]
    if spec.package_files:
        out.append(package_configmap(spec, package or {}))
    out += [master_deployment(spec), master_service(spec, owner)]
    return out


# ---- YAML -------------------------------------------------------------------------------
class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the job spec, package files) as `|` blocks: readable, diffable."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def dump_yaml(obj: Any) -> str:
    """One manifest as YAML, keys in the order rendered (stable: same input, same text)."""
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


# ---- RBAC ---------------------------------------------------------------------------------
MASTER_RULES: list[dict[str, Any]] = [
    # read its own Deployment (the owner uid) and annotate it with the job's phase
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "patch"]},
    {"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["get", "create", "delete"]},
    {"apiGroups": [""], "resources": ["services"], "verbs": ["get", "create", "delete"]},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "create", "delete"]},
    {"apiGroups": ["scheduling.volcano.sh"], "resources": ["podgroups"],
     "verbs": ["get", "create", "patch", "delete"]},
]


def rbac(namespace: str) -> list[Manifest]:
    """The master's ServiceAccount, Role and RoleBinding: one namespace, the verbs it uses."""
    meta = {"namespace": namespace, "labels": {APP_LABEL: APP_NAME}}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": SERVICE_ACCOUNT, **meta}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": SERVICE_ACCOUNT, **meta},
         "rules": copy.deepcopy(MASTER_RULES)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": SERVICE_ACCOUNT, **meta},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": SERVICE_ACCOUNT},
         "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": namespace}]},
    ]
