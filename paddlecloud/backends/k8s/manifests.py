"""The Kubernetes objects of a paddlecloud job, rendered as plain dicts from a `JobSpec`.

Pure functions, no I/O: the CLI renders what `paddlecloud job submit` creates (the
job-spec and package ConfigMaps, the master Deployment and its Service), the
master's deployer renders what the leading master creates (the pservers'
StatefulSet and headless Service, the trainers' Indexed Job, a Volcano PodGroup),
`master_rbac()` renders each job's own ServiceAccount, Role and RoleBinding (its
master's rights, named object by object), and `rbac()` the Role of those who submit.
The job's Secret (`tokens_secret`) carries its tokens and the master's TLS certificate
and key, issued at submit; the CA certificate is public, on the master Deployment
(`publish_master_ca`) and mounted in every pod of the job. The job's etcd user
(`etcd_user_secret`, `paddlecloud.etcd_users`) reaches only paddlecloud's own containers,
the master and the pserver agent (`etcd_credentials_of`), its password as a file.

Endpoints. Every pserver's endpoint is a stable DNS name for the life of the job (a
restarted pserver keeps its name, not its IP): with intranet `PodIP` (and `Host`)
its per-pod name behind the role's headless Service, `NAME-ps-<i>.NAME-ps.NS.svc`;
with intranet `Service` its own Service, `NAME-ps-<i>.NS.svc` (one headless
Service per pod, as paddle-operator makes them). A pserver's `POD_IP` is that same
name, built from its own pod name, so its `POD_IP:PADDLE_PORT` appears exactly once
in `PADDLE_PSERVERS_IP_PORT_LIST`, which is how PaddlePaddle finds its pserver id.
Trainers (collective or gloo) and heter trainers are named the same way. `Host`
runs the pods on the node's network on a port pair chosen per job (`paddle_port`)
and declared as host ports, so the scheduler never puts two pods that want one
port on one node.

Users' containers run as written (docs/design.md section 12): a PaddleJob template's
image, command, args, workingDir and user are kept; `--module` runs `python3 -m MODULE`
in the job's image. paddlecloud never wraps them and never needs to be in their image:
its own part runs beside them in containers of `spec.paddlecloud_image` and reaches the
program only through env (all static: endpoints are DNS names, PADDLE_TRAINER_ID the
Indexed Job's completion index by the downward API) and the tokens volume. Trainers and
heter trainers get init containers that wait until the master serves and every pserver
registered (`paddlecloud trainer` without a program), then until every pserver listens;
pservers get a native sidecar (a `restartPolicy: Always` init container, Kubernetes >=
1.29) running the pserver agent, which claims the pod's slot and registers it in etcd,
and holds it while the pserver listens. Users' pods keep their image's user unless the
job asks for the restricted profile (`harden_user_pod`); paddlecloud's containers are
restricted always.

What this does NOT guarantee: that the API server accepts a user's raw pod
template from a PaddleJob (it is merged, not validated, here).
"""

from __future__ import annotations

import base64
import copy
import logging
import zlib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import yaml

from paddlecloud import paddle_launcher
from paddlecloud.checkpoints import checkpoints_dir
from paddlecloud.exits import STOP_GRACE_ENV
from paddlecloud.jobspec import HOST_PORT_RANGE, JobSpec, JobSpecError
from paddlecloud.master_flags import master_flags
from paddlecloud.phase import Phase

if TYPE_CHECKING:
    from paddlecloud.tls import MasterCertificate

logger = logging.getLogger(__name__)

Manifest = dict[str, Any]

# Labels and annotations.
APP_LABEL = "app.kubernetes.io/name"
APP_NAME = "paddlecloud"
JOB_LABEL = "paddlecloud.org/job"
ROLE_LABEL = "paddlecloud.org/role"
PHASE_ANNOTATION = "paddlecloud.org/phase"
PHASE_REASON_ANNOTATION = "paddlecloud.org/phase-reason"
# "current/total" epochs of the job's data, written by the leading master when the epoch
# moves: whoever may read the Deployment (`kubectl get pdj`'s operator) sees the progress
# without a token for, or a route to, the master
EPOCH_ANNOTATION = "paddlecloud.org/epoch"
TASKS_ANNOTATION = "paddlecloud.org/tasks"  # "done/total" tasks of the current epoch, likewise
# "cause=seconds,..." the job's trainer-seconds by cause (goodput: docs/metrics.md), written by
# the leading master every half minute: the PaddleJob's status.goodput is read from it
GOODPUT_ANNOTATION = "paddlecloud.org/goodput"
# set by the deployer while it restarts a collective trainer group (why), "" after
RESTARTING_ANNOTATION = "paddlecloud.org/restarting"
# set by the operator on a master it creates again after a suspend: its deployer restarts the
# epoch at the checkpoint before it creates the trainers (docs/kubernetes.md, Kueue)
RESUME_ANNOTATION = "paddlecloud.org/resume-from-checkpoint"
RESUME_PENDING, RESUME_DONE = "pending", "done"  # set by the operator, then by the master
# A suspend (spec.suspend, a Kueue eviction) asked of the job's leading master by the operator
# ("true"/"false"): the master drains its trainers and removes its workloads itself, then says
# so with SUSPENDED_ANNOTATION ("true"; "" once it deploys again); only then does the operator
# stop the master (docs/kubernetes.md, "spec.suspend")
SUSPEND_ANNOTATION = "paddlecloud.org/suspend"
SUSPENDED_ANNOTATION = "paddlecloud.org/suspended"
# "N: what" — the Nth role workload the master created again after it was deleted by hand;
# the operator turns a new value into a WorkloadRecreated Event on the PaddleJob
RECREATED_ANNOTATION = "paddlecloud.org/recreated"
# The uid of a Volcano PodGroup applied with the PaddleJob (from the same file), recorded by
# the operator on the master Deployment: the master's deployer adopts that one object
COMPANION_PODGROUP_ANNOTATION = "paddlecloud.org/companion-podgroup-uid"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"  # set by the StatefulSet controller (k8s >= 1.28)
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"  # set by the StatefulSet controller
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"  # Job controller, k8s >= 1.28
PODGROUP_ANNOTATION = "scheduling.k8s.io/group-name"
# The job's CA certificate (PEM) on the master Deployment: public, so whoever may read the
# job's Deployments (the CLI, the autoscaler) can check the master's TLS certificate
# without any right on Secrets.
MASTER_CA_ANNOTATION = "paddlecloud.org/master-ca"

MASTER, PSERVER, TRAINER, HETER = "master", "pserver", "trainer", "heter"
TEMPLATE_FIELD = {PSERVER: "ps", TRAINER: "worker", HETER: "heter"}  # the PaddleJob's names
# A Pod's status.phase values: Kubernetes' words for a pod, not the job's `Phase`.
POD_PHASES = ("Pending", "Running", "Succeeded", "Failed")

# Ports.
MASTER_PORT = 8080
METRICS_PORT = 9090
PADDLE_PORT = 36000  # every pserver and collective trainer listens here (one per pod)
HOST_PORTS_PER_JOB = 2  # Host intranet: PADDLE_PORT and the gloo port, side by side

# The restricted Pod Security Standard: every pod runs as this non-root user (the image's,
# deploy/Dockerfile), no privilege escalation, no capabilities, the runtime's seccomp profile.
RUN_AS_USER = 10001  # high, so no host user shares it

# Names and paths.
TOKENS_MOUNT = "/var/run/paddlecloud/tokens"  # the job's tokens Secret (paddlecloud.auth)
# The cluster autoscaler's token of the namespace (paddlecloud.auth.ScalerToken): one Secret
# per namespace, put there by the admin (deploy/components/autoscaler/autoscaler.yaml), mounted by every master as
# optional, so a namespace without it still runs jobs (their masters then refuse the autoscaler).
SCALER_SECRET = "paddlecloud-scaler"
SCALER_KEY_SECRET = "paddlecloud-scaler-key"  # the autoscaler's own: the key the tokens come from
SCALER_KEY = "token"
SCALER_MOUNT = "/var/run/paddlecloud/scaler"
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


def heter_name(job: str) -> str:
    return f"{job}-heter"


def role_name(job: str, role: str) -> str:
    """The workload (and headless Service) name of a role's pods."""
    return {PSERVER: pserver_name, TRAINER: trainer_name, HETER: heter_name}[role](job)


def tokens_secret_name(job: str) -> str:
    """The job's tokens (paddlecloud.auth.JobTokens), made by `job submit`."""
    return f"{job}-tokens"


# The master's TLS files in the job's Secret (and so in TOKENS_MOUNT): its certificate and
# key, for the master only; the job's CA certificate, for every pod of the job.
TLS_CERT_KEY, TLS_KEY_KEY, CA_KEY = "tls.crt", "tls.key", "ca.crt"


def tokens_secret(spec: JobSpec, tokens: Mapping[str, str], owner: Mapping[str, Any] | None,
                  *, certificate: MasterCertificate) -> Manifest:
    """The job's Secret: its role tokens and the master's TLS certificate and key (issued at
    submit, `paddlecloud.tls.issue_master_certificate`). The master mounts all of it
    (--tokens-dir, --tls-cert, --tls-key), its trainers and pservers only the trainer token
    (PADDLE_JOB_TOKEN_FILE) and the CA certificate (PADDLE_MASTER_CA_FILE)."""
    data = {role: token.encode() for role, token in tokens.items()}
    data.update({TLS_CERT_KEY: certificate.cert, TLS_KEY_KEY: certificate.key,
                 CA_KEY: certificate.ca})
    return _secret(spec, tokens_secret_name(spec.name), data, owner)


def _secret(spec: JobSpec, name: str, data: Mapping[str, bytes],
            owner: Mapping[str, Any] | None) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(spec, name=name, role=MASTER, owner=owner),
        "type": "Opaque",
        "data": {key: base64.b64encode(value).decode() for key, value in data.items()},
    }


def _token_volume(spec: JobSpec, *, only_trainer: bool) -> dict[str, Any]:
    secret: dict[str, Any] = {"secretName": tokens_secret_name(spec.name), "defaultMode": 0o400}
    if only_trainer:
        secret["items"] = [{"key": "trainer", "path": "trainer"}, {"key": CA_KEY, "path": CA_KEY}]
        # read by the user's program as the image's user and by paddlecloud's wait-master as
        # its own (no fsGroup joins them unless the job is restricted): only the job's
        # containers mount it
        secret["defaultMode"] = 0o444
    return {"name": "job-tokens", "secret": secret}


def master_hosts(job: str, namespace: str) -> list[str]:
    """The DNS names of the master Service: the names its TLS certificate is issued for."""
    name = master_name(job)
    return [name, f"{name}.{namespace}", f"{name}.{namespace}.svc",
            f"{name}.{namespace}.svc.cluster.local"]


def master_certificate_hosts(job: str, namespace: str) -> list[str]:
    """What the master's certificate is issued for: its Service's names, and loopback, so that
    `kubectl port-forward svc/NAME-master` and `--master 127.0.0.1:PORT` verify too."""
    return [*master_hosts(job, namespace), "localhost", "127.0.0.1"]


def publish_master_ca(deployment: Manifest, ca: bytes) -> Manifest:
    """The master Deployment with the job's CA certificate as its MASTER_CA_ANNOTATION."""
    out = copy.deepcopy(deployment)
    out["metadata"].setdefault("annotations", {})[MASTER_CA_ANNOTATION] = ca.decode("ascii")
    return out


# The job's own etcd user (paddlecloud.etcd_users), made by whoever creates the job, in the
# job's Secret NAME-etcd (keys `user`, `password`): read and write on the job's prefix only.
# Optional wherever it is used: a job created without etcd auth has none.
ETCD_USER_MOUNT = "/var/run/paddlecloud/etcd-user"


def etcd_user_secret_name(job: str) -> str:
    return f"{job}-etcd"


def etcd_user_secret(spec: JobSpec, *, user: str, password: str,
                     owner: Mapping[str, Any] | None) -> Manifest:
    """The job's etcd user and password, for its master and its pserver agents alone."""
    return _secret(spec, etcd_user_secret_name(spec.name),
                   {"user": user.encode(), "password": password.encode()}, owner)


def _etcd_user_env(spec: JobSpec) -> list[dict[str, Any]]:
    """The job's etcd user by name, its password as a mounted file, never an env value
    (masters and pserver agents only: trainers need no etcd credentials)."""
    user = {"secretKeyRef": {"name": etcd_user_secret_name(spec.name), "key": "user", "optional": True}}
    return [{"name": "PADDLE_ETCD_USER", "valueFrom": user},
            _value("PADDLE_ETCD_PASSWORD_FILE", f"{ETCD_USER_MOUNT}/password")]


def _etcd_user_volume(spec: JobSpec) -> dict[str, Any]:
    return {"name": "etcd-user", "secret": {"secretName": etcd_user_secret_name(spec.name),
                                            "optional": True, "defaultMode": 0o440}}


def _etcd_user_mount() -> dict[str, Any]:
    return {"name": "etcd-user", "mountPath": ETCD_USER_MOUNT, "readOnly": True}


ETCD_TLS_SECRET = "paddlecloud-etcd-client-tls"  # keys ca.crt, tls.crt, tls.key (docs/kubernetes.md)
ETCD_TLS_MOUNT = "/var/run/paddlecloud/etcd-tls"


def etcd_uses_tls(spec: JobSpec) -> bool:
    return "https://" in spec.etcd_endpoints


def _etcd_tls_env(spec: JobSpec) -> list[dict[str, Any]]:
    """Where the etcd client certificate is mounted, with https:// endpoints (masters and
    pservers only)."""
    if not etcd_uses_tls(spec):
        return []
    return [_value(name, f"{ETCD_TLS_MOUNT}/{key}") for name, key in (
        ("PADDLE_ETCD_CA_FILE", "ca.crt"), ("PADDLE_ETCD_CERT_FILE", "tls.crt"),
        ("PADDLE_ETCD_KEY_FILE", "tls.key"))]


def _etcd_tls_volume() -> dict[str, Any]:
    return {"name": "etcd-tls", "secret": {"secretName": ETCD_TLS_SECRET, "defaultMode": 0o440}}


def _etcd_tls_mount() -> dict[str, Any]:
    return {"name": "etcd-tls", "mountPath": ETCD_TLS_MOUNT, "readOnly": True}


def etcd_credentials_of(spec: JobSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                list[dict[str, Any]]]:
    """(env, volumeMounts, volumes) that give a paddlecloud container (a master, a pserver
    agent) the job's etcd credentials: its own user, and with https:// the client
    certificate."""
    env = [*_etcd_user_env(spec), *_etcd_tls_env(spec)]
    mounts, volumes = [_etcd_user_mount()], [_etcd_user_volume(spec)]
    if etcd_uses_tls(spec):
        mounts.append(_etcd_tls_mount())
        volumes.append(_etcd_tls_volume())
    return env, mounts, volumes


def _give_etcd_credentials(spec: JobSpec, pod: dict[str, Any], containers: list[dict[str, Any]]) -> None:
    """The job's etcd credentials in `containers` (those that run paddlecloud's pserver agent)
    and their volumes in `pod`; no other container of the pod gets them."""
    env, mounts, volumes = etcd_credentials_of(spec)
    for container in containers:
        container["env"] = [*container.get("env", []), *copy.deepcopy(env)]
        container.setdefault("volumeMounts", []).extend(copy.deepcopy(mounts))
    pod.setdefault("volumes", []).extend(volumes)


def spec_configmap_name(job: str) -> str:
    return f"{job}-spec"


def package_configmap_name(job: str) -> str:
    return f"{job}-package"


def podgroup_name(spec: JobSpec) -> str:
    return spec.podgroup_name or spec.name


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
def paddle_port(spec: JobSpec) -> int:
    """The port every pserver, heter and collective trainer listens on.

    On the node's network (intranet Host) a pair of host ports chosen from the job's
    namespace and name, so that two jobs seldom want the same; the pods declare them
    as host ports, so when two do, the scheduler keeps them on different nodes.
    """
    if spec.intranet != "HostNetwork":
        return PADDLE_PORT
    if spec.host_port:
        return spec.host_port
    low, high = HOST_PORT_RANGE
    slots = (high - low) // HOST_PORTS_PER_JOB
    return low + zlib.crc32(f"{spec.namespace}/{spec.name}".encode()) % slots * HOST_PORTS_PER_JOB


def gloo_port(spec: JobSpec) -> int:
    return paddle_port(spec) + 1


def role_host(spec: JobSpec, role: str, *, index: int | str) -> str:
    """The stable DNS name of a role's pod `index` (see the module doc)."""
    name = role_name(spec.name, role)
    if spec.intranet == "Service":
        return f"{name}-{index}.{spec.namespace}.svc"
    return f"{name}-{index}.{name}.{spec.namespace}.svc"


def role_endpoints(spec: JobSpec, role: str) -> list[str]:
    port = paddle_port(spec)
    return [f"{role_host(spec, role, index=i)}:{port}" for i in range(spec.replicas_of(role))]


def pserver_host(spec: JobSpec, index: int) -> str:
    return role_host(spec, PSERVER, index=index)


def pserver_endpoints(spec: JobSpec) -> list[str]:
    return role_endpoints(spec, PSERVER)


def trainer_host(spec: JobSpec, index: int | str) -> str:
    return role_host(spec, TRAINER, index=index)


def trainer_endpoints(spec: JobSpec) -> list[str]:
    return role_endpoints(spec, TRAINER)


def heter_endpoints(spec: JobSpec) -> list[str]:
    return role_endpoints(spec, HETER)


def master_address(job: str, namespace: str) -> str:
    """The master Service's address: it routes to the ready master, the leader."""
    return f"{master_name(job)}.{namespace}.svc:{MASTER_PORT}"


def master_endpoint(spec: JobSpec) -> str:
    return master_address(spec.name, spec.namespace)


def needs_trainer_service(spec: JobSpec) -> bool:
    """Trainers that talk to each other (collective, gloo) or to heter trainers need names;
    with intranet Service every pod of every role has its Service (paddle-operator's)."""
    return spec.collective or spec.with_gloo > 0 or spec.heters > 0 or spec.intranet == "Service"


def gloo_http_endpoint(spec: JobSpec) -> str:
    host = pserver_host(spec, 0) if spec.pservers else trainer_host(spec, 0)
    return f"{host}:{gloo_port(spec)}"


def gets_gloo(spec: JobSpec, role: str) -> bool:
    """withGloo 1: trainers (and heter trainers); 2: pservers too (paddle-operator's meaning)."""
    return bool(spec.with_gloo) and (role != PSERVER or spec.with_gloo == 2)


# ---- environment (docs/design.md section 8) ------------------------------------------------------
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
        _value("PADDLE_MASTER_CA_FILE", f"{TOKENS_MOUNT}/{CA_KEY}"),
        _value("PADDLE_TRAINERS_NUM", spec.trainers),
        _value("PADDLE_PSERVERS_NUM", spec.pservers),
        _value("PADDLE_PORT", paddle_port(spec)),
    ]
    if spec.pservers:
        env.append(_value("PADDLE_PSERVERS_IP_PORT_LIST", ",".join(pserver_endpoints(spec))))
    if spec.heters:
        env += _heter_env(spec, role)
    if gets_gloo(spec, role):
        env += [
            _value("PADDLE_WITH_GLOO", spec.with_gloo),
            _value("PADDLE_GLOO_RENDEZVOUS", 3),  # 3: the HTTP store
            _value("PADDLE_GLOO_HTTP_ENDPOINT", gloo_http_endpoint(spec)),
        ]
    if spec.inputs:  # where a program that reads its own data finds it (docs/design.md §8)
        env.append(_value("PADDLECLOUD_INPUT", ",".join(spec.inputs)))
    if spec.output:
        env.append(_value("PADDLECLOUD_OUTPUT", spec.output))
    if spec.package_files or spec.package_path:  # a ConfigMap's, or baked in by the Job Server
        env.append(_value("PADDLECLOUD_PACKAGE", PACKAGE_MOUNT))
    user = dict(spec.env)
    if spec.package_files:
        path = PACKAGE_MOUNT + (":" + user.pop("PYTHONPATH") if "PYTHONPATH" in user else "")
        env.append(_value("PYTHONPATH", path))
    env += [_value(k, v) for k, v in user.items()]
    env += [{"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
            for name, secret, key in spec.secret_env]
    return env


def _heter_env(spec: JobSpec, role: str) -> list[dict[str, Any]]:
    """What Paddle's heterogeneous PS reads: two stages, the trainers (1) and the heters (2)."""
    heters = ",".join(heter_endpoints(spec))
    env = [
        _value("PADDLE_HETER_ENDPOINTS", heters),  # paddle-operator's name
        _value("PADDLE_ALL_HETER_TRAINER_IP_PORT_LIST", heters),
        _value("STAGE_NUM", 2),
        _value("PADDLE_STAGE_TRAINERS_NUM", f"[{spec.trainers}, {spec.heters}]"),
    ]
    if role == TRAINER:
        env += [_value("STAGE_ID", 1), _value("PADDLE_NEXT_HETER_TRAINER_IP_PORT_LIST", heters)]
    elif role == HETER:
        template = spec.heter_template or {}
        gpu = any(_wants_gpu(c) for c in (template.get("spec") or {}).get("containers") or [])
        env += [
            _value("STAGE_ID", 2),
            _value("HETER_DEVICE_TYPE", "gpu" if gpu else "cpu"),
            _value("PADDLE_PREVIOUS_HETER_TRAINER_IP_PORT_LIST", ",".join(trainer_endpoints(spec))),
        ]
    return env


def _own_host(spec: JobSpec, role: str) -> str:
    """A StatefulSet pod's own stable name, from its pod name (`$(POD_NAME)`)."""
    if spec.intranet == "Service":
        return f"$(POD_NAME).{spec.namespace}.svc"
    return f"$(POD_NAME).{role_name(spec.name, role)}.{spec.namespace}.svc"


def _stateful_role_env(spec: JobSpec, role: str, training_role: str, id_variable: str,
                       *extra: dict[str, Any]) -> list[dict[str, Any]]:
    """A StatefulSet role's pod: its training role, its index from the pod's label, and its
    stable DNS name as POD_IP (so POD_IP:PADDLE_PORT is in the role's list once)."""
    return [
        _value("TRAINING_ROLE", training_role),
        _value("PADDLE_TRAINING_ROLE", training_role),
        _field("POD_NAME", "metadata.name"),
        _field(id_variable, f"metadata.labels['{POD_INDEX_LABEL}']"),
        _value("POD_IP", _own_host(spec, role)),
        *extra,
        *_common_env(spec, role),
    ]


def pserver_env(spec: JobSpec) -> list[dict[str, Any]]:
    return _stateful_role_env(spec, PSERVER, "PSERVER", "PADDLE_PSERVER_ID")


def heter_env(spec: JobSpec) -> list[dict[str, Any]]:
    """A heter trainer: HETER_TRAINER, its own endpoint once in the heter list."""
    return _stateful_role_env(spec, HETER, "HETER_TRAINER", "PADDLE_HETER_TRAINER_ID",
                              _value("PADDLE_CURRENT_ENDPOINT", f"$(POD_IP):{paddle_port(spec)}"))


def trainer_env(spec: JobSpec) -> list[dict[str, Any]]:
    """A trainer: its id from the completion index; named trainers (collective, gloo, heter,
    intranet Service) get the endpoints, and a `POD_IP` that is their own name in them, as a
    pserver's is: Paddle's launcher decides who serves its rendezvous by comparing the two."""
    named = needs_trainer_service(spec)
    env = [
        _value("TRAINING_ROLE", "TRAINER"),
        _value("PADDLE_TRAINING_ROLE", "TRAINER"),
        _field("PADDLE_TRAINER_ID", f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"),
        _field("POD_NAME", "metadata.name"),
        _value("POD_IP", trainer_host(spec, "$(PADDLE_TRAINER_ID)")) if named
        else _field("POD_IP", "status.podIP"),
    ]
    if named:
        env += [
            _value("PADDLE_TRAINER_ENDPOINTS", ",".join(trainer_endpoints(spec))),
            _value("PADDLE_CURRENT_ENDPOINT", f"$(POD_IP):{paddle_port(spec)}"),
        ]
    if spec.collective:
        env += launcher_env(spec)
    return env + _common_env(spec, TRAINER)


def launcher_env(spec: JobSpec) -> list[dict[str, Any]]:
    """What `python -m paddle.distributed.launch` reads in a collective trainer's pod, for each
    Paddle version (`paddlecloud.paddle_launcher`): trainer 0's endpoint as the master, the
    trainers' hosts, each pod's rank its trainer id."""
    env = paddle_launcher.launcher_env(trainer_endpoints(spec), "$(PADDLE_TRAINER_ID)")
    return [_value(k, v) for k, v in env.items()]


# ---- pods -------------------------------------------------------------------------------------
def container_security() -> dict[str, Any]:
    """A container's part of the restricted profile."""
    return {"allowPrivilegeEscalation": False, "privileged": False,
            "capabilities": {"drop": ["ALL"]}}


def pod_security() -> dict[str, Any]:
    """A pod's part of the restricted profile (volumes it mounts are group-writable by fsGroup)."""
    return {"runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER,
            "fsGroup": RUN_AS_USER, "seccompProfile": {"type": "RuntimeDefault"}}


def helper_security() -> dict[str, Any]:
    """paddlecloud's own containers in a user's pod: restricted on their own, whatever the
    pod's user is (the image's user, docs/kubernetes.md "Pod security")."""
    return {**container_security(), "runAsNonRoot": True, "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER}


def harden_user_pod(spec: JobSpec, pod: dict[str, Any], *, helpers: set[str]) -> None:
    """A trainer's, pserver's or heter's pod: what keeps a user's image working as built.

    User containers get no privilege escalation, no capabilities unless their template
    adds some, and the runtime's seccomp profile; their user and files stay the image's
    (a root image writing into its WORKDIR still can). The restricted profile
    (`security_profile: restricted`) adds a non-root pod user, `spec.run_as_user`, and
    fsGroup. paddlecloud's own containers (`helpers`) are restricted either way. A
    template's explicit values are kept (podtemplates.check_template refuses the unsafe
    ones unless the submitter allowed them).
    """
    context = pod.setdefault("securityContext", {})
    context.setdefault("seccompProfile", {"type": "RuntimeDefault"})
    if spec.security_profile == "restricted":
        for key, value in {"runAsNonRoot": True, "runAsUser": spec.run_as_user,
                           "runAsGroup": spec.run_as_user, "fsGroup": spec.run_as_user}.items():
            context.setdefault(key, value)
    for container in [*(pod.get("initContainers") or []), *pod.get("containers", [])]:
        ours = helper_security() if container.get("name") in helpers else {
            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
        theirs = container.setdefault("securityContext", {})
        if (theirs.get("capabilities") or {}).get("add"):
            ours.pop("capabilities", None)  # the template chose its capabilities
        for key, value in ours.items():
            theirs.setdefault(key, value)


def _resources(cpu: str, memory: str, gpu: int) -> dict[str, Any]:
    limits: dict[str, str] = {"memory": memory}
    if gpu:
        limits["nvidia.com/gpu"] = str(gpu)
    return {"requests": {"cpu": cpu, "memory": memory}, "limits": limits}


def _wants_gpu(container: Mapping[str, Any]) -> bool:
    resources = container.get("resources") or {}
    return any("nvidia.com/gpu" in (resources.get(k) or {}) for k in ("limits", "requests"))


# `python3`, not `python`: every Python image has it (Debian's and Ubuntu's have no `python`
# unless python-is-python3 is installed, as paddle-operator's tutorial images are built)
PYTHON = "python3"
PORTWATCH = [PYTHON, "-m", "paddlecloud.backends.k8s.portwatch"]
HELPER_RESOURCES = {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}
WAIT_MASTER, WAIT_PSERVERS, PSERVER_AGENT = "wait-master", "wait-pservers", "paddlecloud-agent"
HELPERS = {WAIT_MASTER, WAIT_PSERVERS, PSERVER_AGENT}


def module_command(spec: JobSpec) -> list[str]:
    """`python3 -m MODULE`: what --module runs in the job's image."""
    return [PYTHON, "-m", spec.module]


def _helper(spec: JobSpec, name: str, command: list[str], env: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": name, "image": spec.paddlecloud_image, "command": command,
            "env": copy.deepcopy(env), "resources": copy.deepcopy(HELPER_RESOURCES)}


def wait_for_master_container(spec: JobSpec, env: list[dict[str, Any]]) -> dict[str, Any]:
    """The init container that holds a trainer (or heter) until the master serves and every
    pserver registered: `paddlecloud trainer` without a program waits, then exits 0."""
    return _helper(spec, WAIT_MASTER, ["paddlecloud", "trainer"], env)


def wait_for_pservers_container(spec: JobSpec) -> dict[str, Any]:
    """The init container that holds a trainer (or heter) until every pserver listens."""
    return _helper(spec, WAIT_PSERVERS, [*PORTWATCH, "--wait", "$(PADDLE_PSERVERS_IP_PORT_LIST)"],
                   [_value("PADDLE_PSERVERS_IP_PORT_LIST", ",".join(pserver_endpoints(spec)))])


def pserver_sidecar(spec: JobSpec, env: list[dict[str, Any]]) -> dict[str, Any]:
    """The native sidecar of a pserver: the pserver agent claims the pod's slot, registers
    `POD_IP:PADDLE_PORT` in etcd and holds it while the pserver listens."""
    command = ["paddlecloud", PSERVER, "--", *PORTWATCH, "--hold", "127.0.0.1:$(PADDLE_PORT)"]
    return {**_helper(spec, PSERVER_AGENT, command, env),
            "restartPolicy": "Always"}  # a native sidecar (Kubernetes >= 1.29)


def helper_containers(spec: JobSpec, role: str, env: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """paddlecloud's containers beside a role's program, in start order (see the module doc)."""
    if role == PSERVER:
        return [pserver_sidecar(spec, env)]
    waits = [wait_for_master_container(spec, env)]
    if spec.pservers:
        waits.append(wait_for_pservers_container(spec))
    return waits


def _merge_env(*, where: str, ours: list[dict[str, Any]], theirs: list[Any]) -> list[dict[str, Any]]:
    mine = {e["name"] for e in ours}
    for entry in theirs:
        if entry.get("name") in mine:
            raise JobSpecError(
                f"{where}.containers[0].env sets {entry.get('name')}, which paddlecloud sets itself "
                "(DESIGN.md section 8): remove it"
            )
    return [*ours, *copy.deepcopy(list(theirs))]


def _add_port(container: dict[str, Any], *, name: str, port: int, host: bool) -> None:
    """A named container port; on the node's network also a host port (the scheduler then
    never puts two pods wanting it on one node)."""
    ports = container.setdefault("ports", [])
    if any(p.get("containerPort") == port or p.get("name") == name for p in ports):
        return
    ports.append({"name": name, "containerPort": port, **({"hostPort": port} if host else {})})


def _pod_template(spec: JobSpec, role: str, *, template: Mapping[str, Any] | None,
                  env: list[dict[str, Any]]) -> dict[str, Any]:
    """A pod template: the PaddleJob's (merged) or one built from the spec's resources."""
    where = f"spec.{TEMPLATE_FIELD[role]}.template.spec"
    tpl = copy.deepcopy(dict(template)) if template is not None else {}
    meta = tpl.setdefault("metadata", {})
    for key in ("name", "namespace", "generateName", "ownerReferences"):
        meta.pop(key, None)
    meta["labels"] = {**(meta.get("labels") or {}), **labels(spec, role)}
    pod = tpl.setdefault("spec", {})
    if template is not None:
        container = pod["containers"][0]
        if spec.module and not container.get("command"):  # -f with --module: it fills the gap
            container["command"] = module_command(spec)
    else:
        if role == PSERVER:
            resources = _resources(spec.pserver_cpu, spec.pserver_memory, 0)
        else:
            resources = _resources(spec.trainer_cpu, spec.trainer_memory, spec.trainer_gpu)
        # the module runs in the job's image as written: it need not hold paddlecloud
        container = {"name": role, "image": spec.image, "command": module_command(spec),
                     "resources": resources}
        pod["containers"] = [container]
    container["env"] = _merge_env(where=where, ours=env, theirs=container.get("env") or [])
    port, host = paddle_port(spec), spec.intranet == "HostNetwork"
    _add_port(container, name="paddle", port=port, host=host)
    if gets_gloo(spec, role):
        _add_port(container, name="gloo-http", port=gloo_port(spec), host=host)
    taken = sorted({c.get("name") for c in [*(pod.get("initContainers") or []), *pod["containers"]]}
                   & HELPERS)
    if taken:
        raise JobSpecError(f"{where} has a container named {taken[0]!r}, the name of one of "
                           "paddlecloud's own containers in the pod: rename it")
    helpers = helper_containers(spec, role, env)
    pod["initContainers"] = [*helpers, *(pod.get("initContainers") or [])]

    mounts = container.setdefault("volumeMounts", [])
    volumes = pod.setdefault("volumes", [])
    if spec.package_files:
        volumes.append({"name": "package", "configMap": {
            "name": package_configmap_name(spec.name),
            "items": [{"key": package_key(p), "path": p} for p in spec.package_files],
        }})
        mounts.append({"name": "package", "mountPath": PACKAGE_MOUNT, "readOnly": True})
    volumes.append(_token_volume(spec, only_trainer=True))
    tokens = {"name": "job-tokens", "mountPath": TOKENS_MOUNT, "readOnly": True}
    mounts.append(tokens)
    for helper in helpers:
        if helper["name"] == WAIT_MASTER:
            helper["volumeMounts"] = [dict(tokens)]
    if role == PSERVER:  # its agent registers in etcd, from the sidecar: only it gets credentials
        _give_etcd_credentials(spec, pod, [h for h in helpers if h["name"] == PSERVER_AGENT])
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

    pod.setdefault("automountServiceAccountToken", False)  # trainers and pservers call no API
    harden_user_pod(spec, pod, helpers=HELPERS)
    if spec.scheduler_of(role):
        pod["schedulerName"] = spec.scheduler_of(role)  # a template's is kept as written
    if spec.scheduler_of(role) == "volcano":
        meta["annotations"] = {**(meta.get("annotations") or {}),
                               PODGROUP_ANNOTATION: podgroup_name(spec)}
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
def _service_ports(spec: JobSpec, *, gloo: bool) -> list[dict[str, Any]]:
    port = paddle_port(spec)
    ports = [{"name": "paddle", "port": port, "targetPort": port}]
    if gloo:
        ports.append({"name": "gloo-http", "port": gloo_port(spec), "targetPort": gloo_port(spec)})
    return ports


def _headless_service(spec: JobSpec, *, name: str, role: str, owner: Mapping[str, Any] | None,
                      gloo: bool, pod_selector: Mapping[str, str] | None = None) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(spec, name=name, role=role, owner=owner),
        "spec": {
            "clusterIP": "None",
            # peers must resolve each other before they are ready
            "publishNotReadyAddresses": True,
            "selector": {**selector(spec, role), **(pod_selector or {})},
            "ports": _service_ports(spec, gloo=gloo),
        },
    }


def _role_gloo_port(spec: JobSpec, role: str) -> bool:
    """Whether the role's pod 0 serves the gloo rendezvous store (pserver 0, else trainer 0)."""
    if not spec.with_gloo:
        return False
    return role == PSERVER if spec.pservers else role == TRAINER


def role_services(spec: JobSpec, role: str, *, owner: Mapping[str, Any] | None) -> list[Manifest]:
    """A role's headless Service (its pods' DNS names), then, with intranet Service, one
    headless Service per pod, named as the pod, as paddle-operator makes them."""
    name = role_name(spec.name, role)
    gloo = _role_gloo_port(spec, role)
    out = [_headless_service(spec, name=name, role=role, owner=owner, gloo=gloo)]
    if spec.intranet == "Service":
        for i in range(spec.replicas_of(role)):
            pod = ({COMPLETION_INDEX_LABEL: str(i)} if role == TRAINER
                   else {POD_NAME_LABEL: f"{name}-{i}"})
            out.append(_headless_service(spec, name=f"{name}-{i}", role=role, owner=owner,
                                         gloo=gloo, pod_selector=pod))
    return out


def _statefulset(spec: JobSpec, role: str, *, env: list[dict[str, Any]],
                 owner: Mapping[str, Any] | None) -> Manifest:
    template = _pod_template(spec, role, template=spec.template_of(role), env=env)
    template["spec"]["restartPolicy"] = "Always"  # the only policy a StatefulSet takes
    # ready once it listens (its Service publishes not-ready pods anyway: this is for
    # `kubectl get` and the disruption budget); no liveness probe: a pserver that stops
    # listening is its agent's to end, and a restart loses its parameters
    template["spec"]["containers"][0].setdefault("readinessProbe", {
        "tcpSocket": {"port": paddle_port(spec)}, "periodSeconds": 10})
    name = role_name(spec.name, role)
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _metadata(spec, name=name, role=role, owner=owner),
        "spec": {
            "serviceName": name,
            "replicas": spec.replicas_of(role),
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector(spec, role)},
            "template": template,
        },
    }


def pserver_statefulset(spec: JobSpec, owner: Mapping[str, Any] | None) -> Manifest:
    """The pservers: the ordinal is the pserver index (with the agent: `paddlecloud pserver -- <cmd>`)."""
    return _statefulset(spec, PSERVER, env=pserver_env(spec), owner=owner)


def heter_statefulset(spec: JobSpec, owner: Mapping[str, Any] | None) -> Manifest:
    """The heter trainers (heterogeneous PS): stable names, the ordinal is the heter id."""
    return _statefulset(spec, HETER, env=heter_env(spec), owner=owner)


def trainer_backoff_limit(spec: JobSpec) -> int:
    """Generous: trainers rejoin after a failure, so only a crash loop should end the Job."""
    return max(10, 3 * spec.trainers)


# A stopped trainer (a deleted pod: a preemption, a suspend, a group restart) may drain to a
# checkpoint (trainer_agent.termination): it is told the pod's grace before SIGKILL, less a
# margin for its exit, in PADDLECLOUD_STOP_GRACE. Kubernetes' default grace, said explicitly;
# a template's own is kept.
TRAINER_TERMINATION_GRACE = 30
STOP_GRACE_MARGIN = 5


def _tell_the_stop_grace(pod: dict[str, Any]) -> None:
    grace = int(pod.setdefault("terminationGracePeriodSeconds", TRAINER_TERMINATION_GRACE))
    program = pod["containers"][0]
    if not any(e.get("name") == STOP_GRACE_ENV for e in program.get("env") or []):
        program.setdefault("env", []).append(
            _value(STOP_GRACE_ENV, str(max(1, grace - STOP_GRACE_MARGIN))))


def trainer_job(spec: JobSpec, owner: Mapping[str, Any] | None) -> Manifest:
    """The trainers: an Indexed Job whose completion index is `PADDLE_TRAINER_ID`."""
    template = _pod_template(spec, TRAINER, template=spec.worker_template, env=trainer_env(spec))
    pod = template["spec"]
    _tell_the_stop_grace(pod)
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


def gang_size(spec: JobSpec, roles: tuple[str, ...] | None = None) -> int:
    """The pods of `roles` (default: all) that Volcano schedules."""
    return sum(spec.replicas_of(r) for r in spec.volcano_roles if roles is None or r in roles)


def podgroup(spec: JobSpec, owner: Mapping[str, Any] | None, *, min_member: int | None = None) -> Manifest:
    """A Volcano PodGroup for gang scheduling.

    `min_member` is the gang of the roles deployed so far (default: the whole job's);
    a minMember the user gave (schedulingPolicy.minAvailable, a PodGroup document)
    caps it, so the pservers, which start before the trainers, are never held back
    waiting for trainers that come only once the pservers have registered.
    """
    staged = gang_size(spec) if min_member is None else min_member
    body: dict[str, Any] = {"minMember": min(staged, spec.min_member) if spec.min_member else staged}
    if spec.queue:
        body["queue"] = spec.queue
    if spec.priority_class:
        body["priorityClassName"] = spec.priority_class
    if spec.min_resources:
        body["minResources"] = dict(spec.min_resources)
    return {
        "apiVersion": VOLCANO_API_VERSION,
        "kind": "PodGroup",
        "metadata": _metadata(spec, name=podgroup_name(spec), role=MASTER, owner=owner),
        "spec": body,
    }


def master_objects(spec: JobSpec, owner: Mapping[str, Any] | None) -> list[Manifest]:
    """Everything the leading master creates, in creation order (for --dry-run and tests)."""
    out: list[Manifest] = []
    if spec.uses_volcano:
        out.append(podgroup(spec, owner))
    if spec.pservers:
        out += [*role_services(spec, PSERVER, owner=owner), pserver_statefulset(spec, owner)]
    if spec.heters:
        out += [*role_services(spec, HETER, owner=owner), heter_statefulset(spec, owner)]
    if needs_trainer_service(spec):
        out += role_services(spec, TRAINER, owner=owner)
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


REQUIREMENTS_FILE = "requirements.txt"


def _check_no_requirements(spec: JobSpec, contents: Mapping[str, bytes]) -> None:
    text = contents.get(REQUIREMENTS_FILE, b"").decode("utf-8", errors="replace")
    listed = [line.strip() for line in text.splitlines()
              if line.strip() and not line.strip().startswith("#")]
    if listed:
        shown = ", ".join(listed[:3]) + (f" (and {len(listed) - 3} more)" if len(listed) > 3 else "")
        raise JobSpecError(
            f"package {spec.package_path or '(package)'}: {REQUIREMENTS_FILE} lists {shown}, and a "
            "package shipped without an image build is not installed: build an image with them "
            "(a Job Server with a build configuration, or your own image with --image / "
            "base_image) or empty requirements.txt")


def package_configmap(spec: JobSpec, contents: Mapping[str, bytes]) -> Manifest:
    """The user's package directory, file by file; text as `data`, the rest as `binaryData`.

    Raises `PackageTooLarge` when it would not fit in one ConfigMap (1 MiB), and
    `JobSpecError` when its requirements.txt lists packages: nothing installs them for a
    package shipped this way (only an image build does), so the job is refused before
    anything is created rather than run without them.
    """
    _check_no_requirements(spec, contents)
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
        inputs=spec.inputs or (), epochs=spec.epochs, data_format=spec.data_format,
        chunk_bytes=spec.chunk_bytes or None,  # 0: the master's own default
        shuffle_seed=spec.shuffle_seed,
        # a job started again on the same output resumes after its checkpoint
        resume_from=checkpoints_dir(spec.output) if spec.output and spec.inputs else None,
        tokens_dir=TOKENS_MOUNT, scaler_token_file=f"{SCALER_MOUNT}/{SCALER_KEY}",
        tls_cert=f"{TOKENS_MOUNT}/{TLS_CERT_KEY}", tls_key=f"{TOKENS_MOUNT}/{TLS_KEY_KEY}",
        deployer="kubernetes", job_spec=f"{SPEC_MOUNT}/{SPEC_KEY}",
    )
    return ["paddlecloud", "master", *flags]


def master_deployment(spec: JobSpec) -> Manifest:
    """Two masters campaigning in etcd; the root owner of everything else of the job.

    Readiness is `/ready` on the master's HTTP port, 200 only on the leader once it
    serves (the gRPC health check's SERVING), so the Service routes to the leader;
    liveness is a TCP check, so a standby lives. (The gRPC port serves TLS, which the
    kubelet's own gRPC probe cannot speak; a plain HTTP GET costs the pod nothing.) The
    job's CA certificate is added at submit (`publish_master_ca`), when it is issued.
    """
    mounts = [{"name": "job-spec", "mountPath": SPEC_MOUNT, "readOnly": True},
              {"name": "job-tokens", "mountPath": TOKENS_MOUNT, "readOnly": True},
              {"name": "scaler-token", "mountPath": SCALER_MOUNT, "readOnly": True}]
    volumes: list[dict[str, Any]] = [
        {"name": "job-spec", "configMap": {"name": spec_configmap_name(spec.name)}},
        _token_volume(spec, only_trainer=False),
        {"name": "scaler-token", "secret": {"secretName": SCALER_SECRET, "optional": True,
                                            "defaultMode": 0o400,
                                            "items": [{"key": SCALER_KEY, "path": SCALER_KEY}]}},
    ]
    etcd_env, etcd_mounts, etcd_volumes = etcd_credentials_of(spec)
    mounts += etcd_mounts
    volumes += etcd_volumes
    if spec.data_volume is not None:
        mounts.append({"name": "data", "mountPath": spec.data_volume.mount_path, "readOnly": True})
        volumes.append({"name": "data", "persistentVolumeClaim": {
            "claimName": spec.data_volume.claim, "readOnly": True}})
    container = {
        "name": "master",
        "image": spec.paddlecloud_image,
        "command": master_command(spec),
        "env": [
            _value("PADDLE_JOB_NAME", spec.name),
            _value("PADDLE_NAMESPACE", spec.namespace),
            _value("PADDLE_ETCD_ENDPOINTS", spec.etcd_endpoints),
            _field("POD_NAME", "metadata.name"),
            _field("POD_IP", "status.podIP"),
            *etcd_env,
        ],
        "ports": [
            {"name": "grpc", "containerPort": MASTER_PORT},
            {"name": "metrics", "containerPort": METRICS_PORT},
        ],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "metrics"},
                           "periodSeconds": 2, "timeoutSeconds": 2, "failureThreshold": 1},
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
                    "serviceAccountName": master_account_name(spec.name),
                    "securityContext": pod_security(),
                    "containers": [{**container, "securityContext": container_security()}],
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


MASTER_CLIENT_LABEL = "paddlecloud.org/master-client"  # "true": may call any job's master (gRPC)
# The autoscaler's pods (deploy/components/autoscaler/autoscaler.yaml), which call every job's master from their own
# namespace: GetStatus and ScaleTrainers, with the scaler token.
AUTOSCALER_NAMESPACE = "paddlecloud-system"
AUTOSCALER_LABELS = {APP_LABEL: APP_NAME, "app.kubernetes.io/component": "autoscaler"}
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set by the API server on every namespace
# "true" on a namespace (a cluster admin's mark: tenants cannot label namespaces): its
# master-client pods (the job server's) may call the masters of jobs in every namespace.
MASTER_CLIENTS_NAMESPACE_LABEL = "paddlecloud.org/master-clients"


DNS_PORT = 53
# The API server, as the master's deployer reaches it: the `kubernetes` Service's port, and the
# port behind it (a CNI may check either side of the Service's address translation). Its
# address is no pod's, so no selector can name it: these ports to any address.
API_SERVER_PORTS = (443, 6443)
# Ports of the remote storage of a job's inputs and output (fsspec protocols), where the URL
# names none: what each service listens on by default; any other protocol: HTTPS.
STORAGE_PORTS = {"http": (80,), "hdfs": (8020, 9866), "webhdfs": (9870, 9864)}
LOCAL_PROTOCOLS = ("", "file", "local", "memory")


def storage_ports(spec: JobSpec) -> list[int]:
    """The TCP ports of the remote storage the job's inputs and output name ([] for local
    paths and volumes): what its master, trainers and pservers may reach anywhere."""
    from urllib.parse import urlsplit

    ports: list[int] = []
    for path in (*spec.inputs, *((spec.output,) if spec.output else ())):
        protocol = path.split("://", 1)[0].lower() if "://" in path else ""
        if protocol in LOCAL_PROTOCOLS:
            continue
        try:
            given = urlsplit(path).port
        except ValueError:
            given = None
        ports += [given] if given else STORAGE_PORTS.get(protocol, (443,))
    return sorted(set(ports))


def etcd_ports(spec: JobSpec) -> list[int]:
    """The ports of the job's etcd endpoints (any host: etcd may run outside the cluster)."""
    from paddlecloud.etcd import parse_endpoints

    return sorted({port for _, port in parse_endpoints(spec.etcd_endpoints)})


def _tcp(ports: Iterable[int]) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": port} for port in ports]


def network_policies(spec: JobSpec, owner: Mapping[str, Any] | None) -> list[Manifest]:
    """Ingress and egress of the job's pods (docs/kubernetes.md, "network policies").

    Ingress. `NAME-internal`: the job's pods reach each other on any port (pservers,
    collective and gloo rendezvous, NCCL's own ports, the master's gRPC); nothing else
    reaches trainers, pservers or heters. `NAME-master`: besides, the master's gRPC port
    from pods labelled `paddlecloud.org/master-client: "true"` of the job's namespace or of
    a namespace labelled `paddlecloud.org/master-clients: "true"` (the job server, serving
    several namespaces), and from the autoscaler's pods in `paddlecloud-system`; its
    status/metrics port from the job's namespace and from those master clients (the job
    server proxies the page).

    Egress (policies add up: a pod may reach what any policy selecting it allows).
    `NAME-job-egress`, every pod of the job: the job's pods (the master, the pservers, the
    other trainers and heters), DNS, and the ports of remote storage its inputs and output
    name (`storage_ports`). `NAME-master-egress`: the etcd endpoints' ports and the API
    server's (`API_SERVER_PORTS`): it deploys. `NAME-ps-egress`: the etcd endpoints'
    ports (the pserver agent registers there). Anything else a job's code needs (a model
    hub, another store) is the namespace admin's own NetworkPolicy, which adds to these.
    Needs a CNI that enforces NetworkPolicy; pods on the node's network (intranet Host)
    escape them.

    Names: no policy's suffix ends with another's (`-internal`, `-master`, `-job-egress`,
    `-master-egress`, `-ps-egress`), so job `fit-master` can never render job `fit`'s
    policy (a plain `-egress` beside `-master-egress` once did).
    """
    def policy(name: str, pod_selector: dict[str, str], rules: list[dict[str, Any]], *,
               direction: str = "Ingress") -> Manifest:
        return {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": _metadata(spec, name=name, role=MASTER, owner=owner),
            "spec": {"podSelector": {"matchLabels": pod_selector}, "policyTypes": [direction],
                     direction.lower(): rules},
        }

    def egress(name: str, pod_selector: dict[str, str], rules: list[dict[str, Any]]) -> Manifest:
        return policy(name, pod_selector, rules, direction="Egress")

    job_pods = {JOB_LABEL: spec.name}
    dns = {"ports": [{"protocol": protocol, "port": DNS_PORT} for protocol in ("UDP", "TCP")]}
    to_job = {"to": [{"podSelector": {"matchLabels": job_pods}}]}
    storage = [{"ports": _tcp(ports)}] if (ports := storage_ports(spec)) else []
    to_etcd = {"ports": _tcp(etcd_ports(spec))}
    clients = {"podSelector": {"matchLabels": {MASTER_CLIENT_LABEL: "true"}}}
    marked_clients = {"namespaceSelector": {"matchLabels": {MASTER_CLIENTS_NAMESPACE_LABEL: "true"}}, **clients}
    autoscaler = {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: AUTOSCALER_NAMESPACE}},
                  "podSelector": {"matchLabels": dict(AUTOSCALER_LABELS)}}
    return [
        policy(f"{spec.name}-internal", job_pods, [{"from": [{"podSelector": {"matchLabels": job_pods}}]}]),
        policy(master_name(spec.name), selector(spec, MASTER), [
            {"from": [clients, marked_clients, autoscaler],
             "ports": [{"protocol": "TCP", "port": MASTER_PORT}]},
            {"from": [{"podSelector": {}}, marked_clients], "ports": [{"protocol": "TCP", "port": METRICS_PORT}]},
        ]),
        egress(f"{spec.name}-job-egress", job_pods, [to_job, dns, *storage]),
        egress(f"{master_name(spec.name)}-egress", selector(spec, MASTER),
               [to_etcd, {"ports": _tcp(API_SERVER_PORTS)}]),
        *([egress(f"{pserver_name(spec.name)}-egress", selector(spec, PSERVER), [to_etcd])]
          if spec.pservers else []),
    ]


def submit_objects(spec: JobSpec, package: Mapping[str, bytes] | None = None,
                   *, owner: Mapping[str, Any] | None = None) -> list[Manifest]:
    """What `paddlecloud job submit` creates, in order (the Service is owned once the
    Deployment exists, so `owner` is None in a dry run)."""
    out = [spec_configmap(spec)]
    if spec.package_files:
        out.append(package_configmap(spec, package or {}))
    out += [master_deployment(spec), master_service(spec, owner), *network_policies(spec, owner),
            *master_rbac(spec, owner)]
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
RBAC_API_VERSION = "rbac.authorization.k8s.io/v1"


def master_account_name(job: str) -> str:
    """The job's own ServiceAccount, Role and RoleBinding (one name, three kinds): the master's
    pods run as it, so one job's master holds rights on that job's objects only."""
    return f"{job}-master"


def _most_trainers(spec: JobSpec) -> JobSpec:
    """The spec at the most trainers it may be scaled to (the names a resize may create)."""
    return spec.replace(trainers=max(spec.trainers, spec.trainer_range.maximum))


def master_rules(spec: JobSpec) -> list[dict[str, Any]]:
    """The rules of a job's master: exactly the calls of `paddlecloud.backends.k8s.deployer`, and every
    `get`/`patch`/`delete` limited by `resourceNames` to this job's own objects.

    The deployer creates by server-side apply: a `patch` of the object's name, which the
    API server also authorizes as a `create` when the object is absent. Unscoped, because
    the API cannot scope them by name: `create` and `list` (the trainer pods are found by
    label; a list is authorized before any selector is applied). An object of another
    job's name is never applied to nor adopted by the deployer (it reads the job label
    first). No rule may ever carry an empty `resourceNames`:
    that would mean every name.
    """
    most = _most_trainers(spec)
    services = [s["metadata"]["name"] for role in (PSERVER, HETER, TRAINER)
                for s in role_services(most, role, owner=None)]

    def named(group: str, resource: str, verbs: list[str], names: list[str]) -> dict[str, Any]:
        return {"apiGroups": [group], "resources": [resource], "verbs": verbs,
                "resourceNames": list(dict.fromkeys(names))}

    def anonymous(group: str, resource: str, verbs: list[str]) -> dict[str, Any]:
        return {"apiGroups": [group], "resources": [resource], "verbs": verbs}

    rules = [
        # its own Deployment: the owner uid, the operator's suspend request (read at every
        # poll), and its annotations (phase, progress, restarting, suspended, recreated)
        named("apps", "deployments", ["get", "patch"], [master_name(spec.name)]),
        # the pservers and heters: created (again, after a deletion by hand), read, deleted
        # at the end (cleanPodPolicy) and on a suspend
        anonymous("apps", "statefulsets", ["create"]),
        named("apps", "statefulsets", ["get", "patch", "delete"],
              [pserver_name(spec.name), heter_name(spec.name)]),
        anonymous("", "services", ["create"]),
        named("", "services", ["get", "patch", "delete"], services),
        # the trainers: patch resizes a PS job's Indexed Job; a collective job's group
        # restart and a suspend delete it (a restart recreates it, after listing the
        # group's pods)
        anonymous("batch", "jobs", ["create"]),
        named("batch", "jobs", ["get", "patch", "delete"], [trainer_name(spec.name)]),
        anonymous("", "pods", ["list"]),
    ]
    if spec.uses_volcano:
        rules += [anonymous("scheduling.volcano.sh", "podgroups", ["create"]),
                  named("scheduling.volcano.sh", "podgroups", ["get", "patch", "delete"],
                        [podgroup_name(spec)])]
    return rules


def master_rbac(spec: JobSpec, owner: Mapping[str, Any] | None) -> list[Manifest]:
    """The job's master's ServiceAccount, Role (`master_rules`) and RoleBinding, owned by its
    Deployment like the job's other objects, so deleting the job removes them."""
    name = master_account_name(spec.name)
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": _metadata(spec, name=name, role=MASTER, owner=owner)},
        {"apiVersion": RBAC_API_VERSION, "kind": "Role",
         "metadata": _metadata(spec, name=name, role=MASTER, owner=owner),
         "rules": master_rules(spec)},
        {"apiVersion": RBAC_API_VERSION, "kind": "RoleBinding",
         "metadata": _metadata(spec, name=name, role=MASTER, owner=owner),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": spec.namespace}]},
    ]


SUBMITTER_ROLE = "paddlecloud-submitter"
# What `paddlecloud job submit/status/logs/delete` call (paddlecloud.backends.k8s.jobs), beside the
# master's own verbs: the API server lets a user create a Role only with rights the user holds.
SUBMITTER_RULES: list[tuple[str, str, list[str]]] = [
    ("", "configmaps", ["get", "create", "patch", "delete"]),
    # every object is created by a server-side apply: a patch, and a create where it is absent
    ("apps", "deployments", ["get", "list", "create", "patch", "delete"]),
    ("", "services", ["create", "patch"]),
    # no get: `job status` reads the job's viewer token where a user may read Secrets,
    # which this Role does not grant (else PADDLE_JOB_TOKEN_FILE names a token)
    ("", "secrets", ["create", "patch"]),
    ("networking.k8s.io", "networkpolicies", ["create", "patch"]),
    ("", "serviceaccounts", ["create", "patch"]),
    ("rbac.authorization.k8s.io", "roles", ["create", "patch"]),
    ("rbac.authorization.k8s.io", "rolebindings", ["create", "patch"]),
    ("", "pods", ["list"]),
    ("", "pods/log", ["get"]),
]


def unscoped_rules(rules: list[dict[str, Any]]) -> dict[tuple[str, str], list[str]]:
    """{(API group, resource): verbs} of `rules`, their resourceNames dropped."""
    out: dict[tuple[str, str], list[str]] = {}
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                verbs = out.setdefault((group, resource), [])
                verbs += [v for v in rule["verbs"] if v not in verbs]
    return out


def rbac(namespace: str) -> list[Manifest]:
    """The Role of those who submit jobs in `namespace` (deploy/rbac.yaml): the calls of
    `paddlecloud job`, plus every verb a job's master Role grants (any job's: with Volcano)."""
    every = master_rules(JobSpec(name="any", namespace=namespace, module="m",
                                 scheduler_name="volcano"))
    verbs = unscoped_rules([{"apiGroups": [g], "resources": [r], "verbs": v}
                            for g, r, v in SUBMITTER_RULES] + every)
    return [{"apiVersion": RBAC_API_VERSION, "kind": "Role",
             "metadata": {"name": SUBMITTER_ROLE, "namespace": namespace,
                          "labels": {APP_LABEL: APP_NAME}},
             "rules": [{"apiGroups": [group], "resources": [resource], "verbs": v}
                       for (group, resource), v in verbs.items()]}]
