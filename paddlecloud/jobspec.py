"""`JobSpec`: everything a paddlecloud job on Kubernetes needs, in one frozen value.

The CLI builds a `JobSpec` from `paddlecloud job submit` flags or from a
paddle-operator `PaddleJob` YAML (`paddlecloud.paddlejob`), checks it (`validate`), and
stores it as YAML in the job's ConfigMap (`to_yaml`); the master reads it back with
`--job-spec` (`from_yaml`) and renders the pservers and trainers from it
(`paddlecloud.backends.k8s.manifests`).

What this does NOT guarantee: that the image, the claim, the scheduler or the
module named here exist in the cluster — only the API server and the kubelet can
tell. Raw pod templates from a `PaddleJob` are kept as given (dicts, to be treated
as read-only) and are checked by the API server, not here.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from paddlecloud.elastic import RangeError, TrainerRange
from paddlecloud.units import parse_key_value

logger = logging.getLogger(__name__)

SPEC_VERSION = 1
DEFAULT_IMAGE = "paddlecloud/paddlecloud:0.1.0"
# The pod security of users' containers (docs/kubernetes.md, "Pod security"): `default` keeps
# the image's user and files (no escalation, no capabilities, the runtime's seccomp profile);
# `restricted` adds the restricted Pod Security Standard's non-root user, `run_as_user`.
SECURITY_PROFILES = ("default", "restricted")
DEFAULT_RUN_AS_USER = 10001  # paddlecloud's own image's user (deploy/Dockerfile)
DEFAULT_ETCD_ENDPOINTS = "https://paddlecloud-etcd:2379"  # the client Service of deploy/etcd.yaml
MAX_NAME_LENGTH = 40  # pod names add suffixes such as "-trainer-12" and must stay within 63

CLEAN_POD_POLICIES = ("Always", "OnFailure", "OnCompletion", "Never")
DATA_FORMATS = ("lines", "file")  # what the trainer library's readers take (master --format)
HOST_PORT_RANGE = (30000, 32000)  # Host intranet: where a job's host ports are chosen
# paddle-operator spells the host-network mode "Host"; the spec stores "HostNetwork".
INTRANETS = ("PodIP", "Service", "HostNetwork")

PADDLEJOB_API_VERSION = "batch.paddlepaddle.org/v1"
PADDLEJOB_KIND = "PaddleJob"

# Environment variables paddlecloud injects itself (docs/design.md section 8); a user's
# `-e` may not set them, since two values for one name would silently fight.
RESERVED_ENV = frozenset({
    "PADDLE_HETER_ENDPOINTS", "PADDLE_ALL_HETER_TRAINER_IP_PORT_LIST", "PADDLE_HETER_TRAINER_ID",
    "PADDLE_NEXT_HETER_TRAINER_IP_PORT_LIST", "PADDLE_PREVIOUS_HETER_TRAINER_IP_PORT_LIST",
    "STAGE_ID", "STAGE_NUM", "PADDLE_STAGE_TRAINERS_NUM", "HETER_DEVICE_TYPE",
    "TRAINING_ROLE", "PADDLE_TRAINING_ROLE", "PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM",
    "PADDLE_PSERVERS_IP_PORT_LIST", "PADDLE_PSERVERS_NUM", "PADDLE_PORT", "POD_IP", "POD_NAME",
    "PADDLE_PSERVER_ID", "PADDLE_TRAINER_ENDPOINTS", "PADDLE_CURRENT_ENDPOINT",
    "PADDLE_JOB_NAME", "PADDLE_NAMESPACE", "PADDLE_MASTER_ENDPOINT", "PADDLE_ETCD_ENDPOINTS",
    "PADDLE_WITH_GLOO", "PADDLE_GLOO_RENDEZVOUS", "PADDLE_GLOO_HTTP_ENDPOINT",
    "PADDLECLOUD_INPUT", "PADDLECLOUD_OUTPUT", "PADDLECLOUD_PACKAGE",
})

_DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


class JobSpecError(ValueError):
    """A job spec that cannot run; the message names the bad value and what would be right."""


@dataclass(frozen=True)
class DataVolume:
    """A PersistentVolumeClaim mounted at the same path in the master (read-only) and the trainers."""

    claim: str
    mount_path: str

    @classmethod
    def parse(cls, text: str) -> DataVolume:
        """`CLAIM:PATH`, e.g. `ctr-data:/data`."""
        claim, sep, path = text.partition(":")
        if not sep or not claim or not path:
            raise JobSpecError(
                f"invalid data volume {text!r}: expected CLAIM:PATH, e.g. 'ctr-data:/data'"
            )
        volume = cls(claim=claim, mount_path=path)
        volume.validate()
        return volume

    def validate(self) -> None:
        if len(self.claim) > 253 or not _DNS_1123_SUBDOMAIN.fullmatch(self.claim):
            raise JobSpecError(
                f"invalid claim name {self.claim!r}: a PersistentVolumeClaim name is lower-case "
                "letters, digits, '-' and '.'"
            )
        if not self.mount_path.startswith("/") or ":" in self.mount_path:
            raise JobSpecError(
                f"invalid mount path {self.mount_path!r}: must be an absolute path without ':'"
            )


@dataclass(frozen=True)
class JobSpec:
    """One job. Counts, resources and policies as `paddlecloud job submit` takes them.

    `ps_template`/`worker_template`/`heter_template` are pod templates from a
    `PaddleJob`; when set, they replace the pods paddlecloud would build from
    `image`/`module`/resources (paddlecloud still injects its environment, labels and
    volumes into them), and each keeps the `schedulerName` it was written with.

    `min_trainers`/`max_trainers` are the trainer range (None: equal to `trainers`);
    the master keeps the size within it (`paddlecloud job scale`). `elastic` is
    paddle-operator's `spec.elastic` level, kept as given.
    Every user container runs as written (its image, command, args, working directory and
    user); paddlecloud's part runs beside it in containers of `paddlecloud_image`.
    """

    name: str
    namespace: str = "default"
    image: str = DEFAULT_IMAGE  # where --module runs (PaddleJob templates name their own)
    # paddlecloud's own image: the master and paddlecloud's init containers and sidecars;
    # never a submitter's (the master holds the job's etcd and scaler credentials; issue 34).
    # `job submit --paddlecloud-image`, the Job Server's and the operator's configuration set it.
    paddlecloud_image: str = DEFAULT_IMAGE
    module: str = ""  # `python3 -m MODULE` is what every trainer (and pserver) runs
    package_path: str = ""  # the local directory shipped in the package ConfigMap
    package_files: tuple[str, ...] = ()  # its files, relative to package_path
    inputs: tuple[str, ...] = ()
    output: str = ""
    trainers: int = 1            # the trainer group's size at start (its desired size)
    min_trainers: int | None = None   # the elastic range; None: `trainers` (a fixed job)
    max_trainers: int | None = None
    pservers: int = 0
    trainer_cpu: str = "1"
    trainer_memory: str = "2Gi"
    trainer_gpu: int = 0
    pserver_cpu: str = "1"
    pserver_memory: str = "2Gi"
    env: tuple[tuple[str, str], ...] = ()
    etcd_endpoints: str = DEFAULT_ETCD_ENDPOINTS
    epochs: int = 1
    data_volume: DataVolume | None = None
    clean_pod_policy: str = "OnCompletion"
    scheduler_name: str = ""
    queue: str = ""  # Volcano queue (PaddleJob spec.schedulingPolicy.queue)
    priority_class: str = ""  # PodGroup priorityClassName (spec.schedulingPolicy.priorityClass)
    min_resources: Mapping[str, str] | None = None  # PodGroup minResources
    intranet: str = "PodIP"  # paddle-operator's default
    with_gloo: int = 0
    ps_template: Mapping[str, Any] | None = field(default=None, compare=True, repr=False)
    worker_template: Mapping[str, Any] | None = field(default=None, compare=True, repr=False)
    heters: int = 0  # heterogeneous PS: heter trainers (paddle-operator spec.heter)
    heter_template: Mapping[str, Any] | None = field(default=None, compare=True, repr=False)
    min_member: int = 0  # Volcano PodGroup minMember (0: every pod of the job)
    podgroup_name: str = ""  # the PodGroup's name when a document names one ("" = the job's)
    host_port: int = 0  # Host intranet: the job's first host port (0: chosen from the name)
    elastic: int | None = None
    data_format: str = "lines"
    chunk_bytes: int = 0  # 0: the master's default (64 MiB)
    security_profile: str = "default"  # SECURITY_PROFILES
    run_as_user: int = DEFAULT_RUN_AS_USER  # the uid of the restricted profile
    restart_limit: int = 3  # group restarts after a lost trainer before the job fails
    # (NAME, SECRET, KEY): env from a Secret's key; only the reference is in the job spec
    secret_env: tuple[tuple[str, str, str], ...] = ()
    # templates may ask for privileged, host namespaces, hostPath, root, a service account
    allow_privileged: bool = False
    # Kueue's LocalQueue (the PaddleJob's kueue.x-k8s.io/queue-name label, `job submit --queue`):
    # the job runs once Kueue admits it (docs/kubernetes.md, "Kueue"); "" = not queued
    local_queue: str = ""
    suspend: bool = False  # batch Job semantics: while true, no pserver or trainer runs

    # ---- derived ----------------------------------------------------------------
    @property
    def collective(self) -> bool:
        """No pservers: trainers talk to each other (NCCL on GPUs, gloo on CPUs)."""
        return self.pservers == 0

    def template_of(self, role: str) -> Mapping[str, Any] | None:
        """The PaddleJob pod template of `role` (pserver, trainer, heter), or None."""
        return {"pserver": self.ps_template, "trainer": self.worker_template,
                "heter": self.heter_template}[role]

    def replicas_of(self, role: str) -> int:
        return {"pserver": self.pservers, "trainer": self.trainers, "heter": self.heters}[role]

    def written_scheduler(self, role: str) -> str:
        """The scheduler a role's template names as written (a role without one: `scheduler_name`)."""
        template = self.template_of(role)
        if template is not None:
            return str((template.get("spec") or {}).get("schedulerName") or "")
        return self.scheduler_name

    def scheduler_of(self, role: str) -> str:
        """The scheduler of a role's pods. A job Volcano schedules (any role's template names
        it) is one gang, as under paddle-operator: every role without a scheduler of its own
        joins it (paddle-operator's Example 4 names volcano on the worker template only)."""
        written = self.written_scheduler(role)
        return written or ("volcano" if self.uses_volcano else "")

    @property
    def roles(self) -> tuple[str, ...]:
        """The roles that have pods, in start order."""
        return tuple(r for r in ("pserver", "heter", "trainer") if self.replicas_of(r))

    @property
    def volcano_roles(self) -> tuple[str, ...]:
        return tuple(r for r in self.roles if self.scheduler_of(r) == "volcano")

    @property
    def trainer_range(self) -> TrainerRange:
        """min_trainers..max_trainers (both `trainers` for a fixed job)."""
        return TrainerRange.of(trainers=self.trainers, minimum=self.min_trainers,
                               maximum=self.max_trainers)[0]

    @property
    def uses_volcano(self) -> bool:
        return any(self.written_scheduler(r) == "volcano" for r in self.roles)

    # ---- checks -----------------------------------------------------------------
    def validate(self) -> JobSpec:
        """Raises `JobSpecError` naming the first bad value; returns self for chaining."""
        if len(self.name) > MAX_NAME_LENGTH or not _DNS_1035.fullmatch(self.name):
            raise JobSpecError(
                f"invalid job name {self.name!r}: use at most {MAX_NAME_LENGTH} lower-case letters, "
                "digits and '-', starting with a letter and ending with a letter or digit "
                "(a DNS-1035 label, e.g. 'ctr-wide-deep')"
            )
        if len(self.namespace) > 63 or not _DNS_1123_LABEL.fullmatch(self.namespace):
            raise JobSpecError(
                f"invalid namespace {self.namespace!r}: use at most 63 lower-case letters, digits "
                "and '-' (a DNS-1123 label)"
            )
        if not self.image or any(c.isspace() for c in self.image):
            raise JobSpecError(f"invalid image {self.image!r}: give an image reference such as "
                               f"{DEFAULT_IMAGE!r}")
        if not self.paddlecloud_image or any(c.isspace() for c in self.paddlecloud_image):
            raise JobSpecError(f"invalid paddlecloud image {self.paddlecloud_image[:80]!r}: give "
                               f"an image reference such as {DEFAULT_IMAGE!r}")
        if self.security_profile not in SECURITY_PROFILES:
            raise JobSpecError(f"invalid security profile {self.security_profile[:40]!r}: use "
                               f"{' or '.join(SECURITY_PROFILES)}")
        _check_count("run-as user (uid)", self.run_as_user, minimum=1)
        if self.run_as_user != DEFAULT_RUN_AS_USER and self.security_profile != "restricted":
            raise JobSpecError(
                f"run-as user {self.run_as_user} is the restricted profile's uid: add "
                "--restricted (PaddleJob spec.securityProfile: restricted), or drop it and the "
                "programs run as their images' users"
            )
        _check_count("trainers", self.trainers, minimum=1)
        _check_count("pservers", self.pservers, minimum=0)
        for bound in ("min_trainers", "max_trainers"):
            if getattr(self, bound) is not None:
                _check_count(bound, getattr(self, bound), minimum=1)
        try:
            self.trainer_range  # noqa: B018 (validates the range and `trainers` in it)
        except RangeError as error:
            raise JobSpecError(str(error)) from None
        _check_count("epochs", self.epochs, minimum=1)
        _check_count("restarts (restart limit)", self.restart_limit, minimum=0)
        _check_count("trainer GPUs", self.trainer_gpu, minimum=0)
        _check_count("heter trainers", self.heters, minimum=0)
        _check_count("chunk bytes", self.chunk_bytes, minimum=0)
        _check_count("PodGroup minMember", self.min_member, minimum=0)
        if self.data_format not in DATA_FORMATS:
            raise JobSpecError(
                f"invalid format {self.data_format!r}: use one of {', '.join(DATA_FORMATS)}"
            )
        if self.heters and not self.pservers:
            raise JobSpecError(
                f"{self.heters} heter trainers but no pservers: heterogeneous PS (spec.heter) "
                "needs spec.ps"
            )
        if self.host_port and not HOST_PORT_RANGE[0] <= self.host_port < HOST_PORT_RANGE[1]:
            raise JobSpecError(
                f"invalid host port {self.host_port}: use {HOST_PORT_RANGE[0]}.."
                f"{HOST_PORT_RANGE[1] - 1}"
            )
        for what, value in (("trainer CPU", self.trainer_cpu), ("pserver CPU", self.pserver_cpu),
                            ("trainer memory", self.trainer_memory),
                            ("pserver memory", self.pserver_memory)):
            if not _QUANTITY.fullmatch(value):
                raise JobSpecError(
                    f"invalid {what} {value!r}: use a Kubernetes quantity such as '2', '500m', "
                    "'4Gi' or '512Mi'"
                )
        if self.module and not _MODULE.fullmatch(self.module):
            raise JobSpecError(
                f"invalid module {self.module!r}: give a Python module name such as 'ctr.train'"
            )
        if self.worker_template is None and not self.module:
            raise JobSpecError(
                "no trainer program: give --module (run as `python3 -m MODULE`) or a PaddleJob "
                "with spec.worker.template (-f job.yaml)"
            )
        if self.heters and self.heter_template is None:
            raise JobSpecError("heter trainers need a pod template (PaddleJob spec.heter.template)")
        if self.pservers and self.ps_template is None and not self.module:
            raise JobSpecError(
                "no pserver program: give --module (pservers run it with TRAINING_ROLE=PSERVER) "
                "or a PaddleJob with spec.ps.template"
            )
        for path in self.package_files:
            if path.startswith("/") or ".." in path.split("/") or not path:
                raise JobSpecError(f"invalid package file {path!r}: must be a relative path "
                                   "inside the package directory")
        if self.package_files and not self.package_path:
            raise JobSpecError("package_files given without package_path")
        for pattern in self.inputs:
            if not pattern or not (pattern.startswith("/") or "://" in pattern):
                raise JobSpecError(
                    f"invalid input {pattern!r}: on Kubernetes an input is an absolute path inside "
                    "the pods (e.g. under the --data-volume mount path) or a URL such as "
                    "s3://bucket/train/*.csv"
                )
        seen: set[str] = set()
        for key, secret, secret_key in self.secret_env:
            if len(secret) > 253 or not _DNS_1123_SUBDOMAIN.fullmatch(secret):
                raise JobSpecError(f"invalid Secret name {secret[:64]!r} in --secret-env {key}: "
                                   "a DNS-1123 subdomain, e.g. 'my-credentials'")
            if not _SECRET_KEY.fullmatch(secret_key):
                raise JobSpecError(f"invalid Secret key {secret_key[:64]!r} in --secret-env {key}: "
                                   "letters, digits, '-', '_' and '.'")
        for key in [k for k, _ in self.env] + [k for k, _, _ in self.secret_env]:
            if not _ENV_NAME.fullmatch(key):
                raise JobSpecError(
                    f"invalid environment variable name {key!r}: use letters, digits, '_', '-' "
                    "and '.', not starting with a digit"
                )
            if key in RESERVED_ENV:
                raise JobSpecError(
                    f"environment variable {key} is set by paddlecloud itself (DESIGN.md section 8); "
                    "remove it from -e/--env/--secret-env"
                )
            if key in seen:
                raise JobSpecError(f"environment variable {key} is given twice")
            seen.add(key)
        from paddlecloud.paddlejob import TEMPLATE_ROLES, check_template

        for field_name, role in TEMPLATE_ROLES.items():
            template = getattr(self, field_name)
            if template is not None:
                check_template(template, where=f"spec.{role}.template",
                               allow_privileged=self.allow_privileged)
        if not self.etcd_endpoints.strip():
            raise JobSpecError("no etcd endpoints: give --etcd-endpoints http://HOST:2379[,...]")
        from paddlecloud.etcd import parse_endpoints

        try:
            parse_endpoints(self.etcd_endpoints)
        except ValueError as error:
            raise JobSpecError(str(error)) from None
        if self.data_volume is not None:
            self.data_volume.validate()
        if self.clean_pod_policy not in CLEAN_POD_POLICIES:
            raise JobSpecError(
                f"invalid cleanPodPolicy {self.clean_pod_policy!r}: use one of "
                f"{', '.join(CLEAN_POD_POLICIES)}"
            )
        if self.intranet not in INTRANETS:
            raise JobSpecError(
                f"unsupported intranet {self.intranet!r}: use one of {', '.join(INTRANETS)}"
            )
        if self.with_gloo not in (0, 1, 2):
            raise JobSpecError(
                f"invalid withGloo {self.with_gloo!r}: use 0 (off), 1 (trainers) or 2 (trainers "
                "and pservers)"
            )
        if self.scheduler_name and not _DNS_1123_SUBDOMAIN.fullmatch(self.scheduler_name):
            raise JobSpecError(f"invalid schedulerName {self.scheduler_name!r}")
        if (self.queue or self.priority_class or self.min_resources or self.min_member
                or self.podgroup_name) and not self.uses_volcano:
            raise JobSpecError(
                "schedulingPolicy (minAvailable, queue, priorityClass, minResources) and a PodGroup "
                "need the Volcano scheduler: set schedulerName: volcano in a pod template"
            )
        others = [f"{r} ({self.written_scheduler(r)})" for r in self.roles
                  if self.written_scheduler(r) not in ("", "volcano")]
        if self.uses_volcano and others:
            raise JobSpecError(
                f"the {', '.join(others)} pods name another scheduler than volcano, which "
                "schedules the job's other pods as one gang: remove their schedulerName or set "
                "it to volcano"
            )
        gang = sum(self.replicas_of(r) for r in self.volcano_roles)
        if self.min_member and not 1 <= self.min_member <= gang:
            raise JobSpecError(
                f"PodGroup minMember {self.min_member} is more than the {gang} pods scheduled by "
                f"Volcano ({', '.join(f'{self.replicas_of(r)} {r}' for r in self.volcano_roles)}): "
                "the gang could never be scheduled; use at most that"
            )
        if self.pservers and self.ps_template is None and self.worker_template is not None:
            raise JobSpecError("a PaddleJob with pservers needs spec.ps.template")
        if self.local_queue and (len(self.local_queue) > 63
                                 or not _DNS_1123_LABEL.fullmatch(self.local_queue)):
            raise JobSpecError(
                f"invalid Kueue queue name {self.local_queue[:64]!r}: a LocalQueue's name, at most "
                "63 lower-case letters, digits and '-' (also a valid label value), e.g. 'team-a'")
        return self

    # ---- YAML (the ConfigMap content the master reads with --job-spec) ----------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"spec_version": SPEC_VERSION}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "env":
                value = {k: v for k, v in value}
            elif f.name == "data_volume" and value is not None:
                value = {"claim": value.claim, "mount_path": value.mount_path}
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Mapping):
                value = copy.deepcopy(dict(value))
            out[f.name] = value
        return out

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        if not isinstance(data, Mapping):
            raise JobSpecError(f"a job spec is a mapping, not {type(data).__name__}")
        data = dict(data)
        version = data.pop("spec_version", SPEC_VERSION)
        if version != SPEC_VERSION:
            raise JobSpecError(
                f"job spec version {version!r} is not supported: this paddlecloud reads version "
                f"{SPEC_VERSION}; submit the job again with this paddlecloud"
            )
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise JobSpecError(f"unknown job spec field(s): {', '.join(unknown)}")
        if "name" not in data:
            raise JobSpecError("the job spec has no name")
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key == "env":
                value = tuple((str(k), str(v)) for k, v in (value or {}).items())
            elif key == "data_volume" and value is not None:
                value = DataVolume(claim=value["claim"], mount_path=value["mount_path"])
            elif key in ("inputs", "package_files"):
                value = tuple(str(v) for v in value or ())
            elif key == "secret_env":
                value = tuple((str(n), str(sec), str(k)) for n, sec, k in value or ())
            kwargs[key] = value
        return cls(**kwargs)

    @classmethod
    def from_yaml(cls, text: str) -> JobSpec:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise JobSpecError(f"the job spec is not valid YAML: {error}") from None
        return cls.from_dict(data)

    def replace(self, **changes: Any) -> JobSpec:
        return dataclasses.replace(self, **changes)

    # ---- paddle-operator PaddleJob ------------------------------------------------
    @classmethod
    def from_paddlejob(cls, doc: Mapping[str, Any], **overrides: Any) -> JobSpec:
        """A spec from a paddle-operator `PaddleJob`: `paddlecloud.paddlejob.translate`,
        the one translation `job submit -f` and the operator share."""
        from paddlecloud.paddlejob import translate

        return translate(doc, **overrides)


def _check_count(what: str, value: object, *, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise JobSpecError(f"invalid number of {what} {value!r}: must be an integer >= {minimum}")


def parse_secret_env(pairs: Iterable[str]) -> tuple[tuple[str, str, str], ...]:
    """`["TOKEN=creds/token"]` -> `(("TOKEN", "creds", "token"),)`: NAME from Secret `creds`, key `token`."""
    out = []
    for pair in pairs:
        name, sep, ref = pair.partition("=")
        secret, slash, key = ref.partition("/")
        if not sep or not slash or not name or not secret or not key:
            raise JobSpecError(f"invalid --secret-env {pair[:64]!r}: use NAME=SECRET/KEY "
                               "(the Secret's key becomes NAME; its value is never in the job spec)")
        out.append((name, secret, key))
    return tuple(out)


def parse_env(pairs: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """`["A=1", "B=x=y"]` -> `(("A", "1"), ("B", "x=y"))`; errors name the bad pair."""
    try:
        return tuple(parse_key_value(pair) for pair in pairs)
    except ValueError as error:
        raise JobSpecError(f"invalid environment setting: {error}") from None
