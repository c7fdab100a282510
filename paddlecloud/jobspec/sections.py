"""The sections of the job model: what each holds, how it checks itself, and each field's doors.

`Workload`, `Topology`, `Resources`, `Scheduling`, `Data`, `Recovery` and `Security`
are frozen values that check their own fields (`validate`), naming a bad value; each
field carries its `paddlecloud.jobfields.Doors` (its help, its kind, its name at each
front door, or why a door does not take it). `paddlecloud.jobspec.JobSpec` is made of
them and checks what spans sections.

What this does NOT do: check what spans sections (a program for the trainers, the
pod templates, Volcano's gang) — `JobSpec.validate` does.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from paddlecloud.elastic import RangeError, TrainerRange
from paddlecloud.jobfields import API, CLI, LOCAL, PADDLEJOB, SERVER, JobSpecError, job_field
from paddlecloud.paddle_launcher import LAUNCHER_ENV
from paddlecloud.podtemplates import own_secret
from paddlecloud.untrusted import quote

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
}) | LAUNCHER_ENV  # what Paddle's launcher reads in collective trainers

_DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")

# Why a door does not take a field (the doors' `not_at`), said once.
_TEMPLATES_SAY = "a PaddleJob's pod templates say it (their containers' image, command, env, resources)"
_ONE_MACHINE = "one machine: no pods, namespaces, schedulers or images to choose"
_NEEDS_TEMPLATES = "needs pod templates, which only a PaddleJob carries (job submit -f)"
_VOLCANO = ("Volcano gang scheduling: needs a pod template naming schedulerName volcano, which "
            "only a PaddleJob carries (job submit -f)")
_OPERATOR_KEY = "paddle-operator's PaddleJob field: give it in the PaddleJob (job submit -f)"
_FROM_PACKAGE = "read from the package directory (package_path), never given"
_LOCAL_IS_PRIVATE = "local processes run as you, with your environment"
_NO_TEMPLATES = "the Python API and the Job Server build the pods: no template to allow anything in"


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
                f"invalid data volume {quote(text)}: expected CLAIM:PATH, e.g. 'ctr-data:/data'"
            )
        volume = cls(claim=claim, mount_path=path)
        volume.validate()
        return volume

    def __str__(self) -> str:
        return f"{self.claim}:{self.mount_path}"

    def validate(self) -> None:
        if len(self.claim) > 253 or not _DNS_1123_SUBDOMAIN.fullmatch(self.claim):
            raise JobSpecError(
                f"invalid claim name {quote(self.claim)}: a PersistentVolumeClaim name is lower-case "
                "letters, digits, '-' and '.'"
            )
        if not self.mount_path.startswith("/") or ":" in self.mount_path:
            raise JobSpecError(
                f"invalid mount path {quote(self.mount_path)}: must be an absolute path without ':'"
            )


def _check_count(what: str, value: object, *, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise JobSpecError(f"invalid number of {what} {value!r:.40}: must be an integer >= {minimum}")


def _check_image(what: str, image: str) -> None:
    if not image or any(c.isspace() for c in image):
        raise JobSpecError(f"invalid {what} {quote(image)}: give an image reference such as "
                           f"{DEFAULT_IMAGE!r}")


# ---- the sections ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Workload:
    """What runs and where: the job's name and namespace, its program, images and environment."""

    name: str = job_field(
        help="The job's name (a DNS-1035 label, at most 40 characters).",
        flag="NAME", paddlejob="metadata.name", api="job_name", local="job")
    namespace: str = job_field(
        "default", help="Kubernetes namespace of the job.  [default: the PaddleJob's, else default]",
        flag="namespace", flag_names=("-n", "--namespace"),
        paddlejob="metadata.namespace", api="namespace", not_at={LOCAL: _ONE_MACHINE})
    image: str = job_field(
        DEFAULT_IMAGE, help="The image --module runs in, as `python3 -m MODULE` (it need not hold "
        f"paddlecloud)  [default: {DEFAULT_IMAGE}]", flag="image", api="base_image",
        local="image", not_at={PADDLEJOB: _TEMPLATES_SAY})
    # paddlecloud's own image: the master and paddlecloud's init containers and sidecars;
    # never a submitter's (the master holds the job's etcd and scaler credentials; issue 34).
    paddlecloud_image: str = job_field(
        DEFAULT_IMAGE, help="paddlecloud's image: the master's, and its containers beside the "
        f"programs  [default: {DEFAULT_IMAGE}]", flag="paddlecloud_image",
        not_at={PADDLEJOB: "the operator's configuration sets it (paddlecloud operator)",
                API: "the Job Server's configuration sets it: a submitter never picks the image "
                     "that holds the job's credentials",
                SERVER: "the Job Server's configuration sets it: a submitter never picks the "
                        "image that holds the job's credentials",
                LOCAL: "the local master runs this paddlecloud"})
    module: str = job_field(
        "", help="Trainers (and pservers) run `python3 -m MODULE`.", flag="module", api="module",
        local="module", not_at={PADDLEJOB: _TEMPLATES_SAY})
    package_path: str = job_field(
        "", kind="directory", help="Directory of your code, shipped in a ConfigMap (< 1 MiB) and put on PYTHONPATH.",
        flag="package_path", local="package_path",
        not_at={PADDLEJOB: _TEMPLATES_SAY,
                API: "trainer_package: the Python API ships that directory itself",
                SERVER: "trainer_package: the digest of a package uploaded with POST /v1/package, "
                        "which the server builds the job's image from"})
    package_files: tuple[str, ...] = job_field(
        (), kind="paths", help="The package's files, relative to package_path.",
        not_at={CLI: _FROM_PACKAGE, PADDLEJOB: _FROM_PACKAGE, API: _FROM_PACKAGE,
                SERVER: _FROM_PACKAGE, LOCAL: _FROM_PACKAGE})
    env: tuple[tuple[str, str], ...] = job_field(
        (), kind="pairs", metavar="KEY=VALUE",
        help="Environment variable of every trainer and pserver (repeatable; -e=K=V and "
             "--e=K=V, the paddle client's spellings, too).",
        flag="env", flag_names=("-e", "--e", "--env"), api="env", local="env", not_at={PADDLEJOB: _TEMPLATES_SAY})
    # (NAME, SECRET, KEY): env from a Secret's key; only the reference is in the job spec
    secret_env: tuple[tuple[str, str, str], ...] = job_field(
        (), kind="secret_refs", metavar="KEY=SECRET/KEY", flag="secret_env",
        help="Environment variable from a Secret's key (repeatable); only the reference is "
             "stored, never the value.",
        not_at={PADDLEJOB: "a template's env valueFrom.secretKeyRef says it",
                API: "a Job Server caller holds no rights on the namespace's Secrets",
                SERVER: "a Job Server caller holds no rights on the namespace's Secrets",
                LOCAL: _LOCAL_IS_PRIVATE})
    etcd_endpoints: str = job_field(
        DEFAULT_ETCD_ENDPOINTS, help="etcd URLs, comma-separated  "
        f"[default: {DEFAULT_ETCD_ENDPOINTS}]", flag="etcd_endpoints", api="etcd_endpoints",
        local="etcd_endpoints",
        not_at={PADDLEJOB: "the operator's configuration (paddlecloud operator --etcd-endpoints)"})

    def validate(self) -> None:
        if len(self.name) > MAX_NAME_LENGTH or not _DNS_1035.fullmatch(self.name):
            raise JobSpecError(
                f"invalid job name {quote(self.name)}: use at most {MAX_NAME_LENGTH} lower-case "
                "letters, digits and '-', starting with a letter and ending with a letter or digit "
                "(a DNS-1035 label, e.g. 'ctr-wide-deep')"
            )
        if len(self.namespace) > 63 or not _DNS_1123_LABEL.fullmatch(self.namespace):
            raise JobSpecError(
                f"invalid namespace {quote(self.namespace)}: use at most 63 lower-case letters, "
                "digits and '-' (a DNS-1123 label)"
            )
        _check_image("image", self.image)
        _check_image("paddlecloud image", self.paddlecloud_image)
        if self.module and not _MODULE.fullmatch(self.module):
            raise JobSpecError(
                f"invalid module {quote(self.module)}: give a Python module name such as 'ctr.train'"
            )
        for path in self.package_files:
            if path.startswith("/") or ".." in path.split("/") or not path:
                raise JobSpecError(f"invalid package file {quote(path)}: must be a relative path "
                                   "inside the package directory")
        if self.package_files and not self.package_path:
            raise JobSpecError("package_files given without package_path")
        self._check_env()
        if not self.etcd_endpoints.strip():
            raise JobSpecError("no etcd endpoints: give --etcd-endpoints http://HOST:2379[,...]")
        # imported here: etcd brings aetcd and grpc, which a spec that is never checked skips
        from paddlecloud.etcd import parse_endpoints

        try:
            parse_endpoints(self.etcd_endpoints)
        except ValueError as error:
            raise JobSpecError(str(error)) from None

    def _check_env(self) -> None:
        seen: set[str] = set()
        for key, secret, secret_key in self.secret_env:
            if len(secret) > 253 or not _DNS_1123_SUBDOMAIN.fullmatch(secret):
                raise JobSpecError(f"invalid Secret name {quote(secret)} in --secret-env {key}: "
                                   "a DNS-1123 subdomain, e.g. 'my-credentials'")
            if not _SECRET_KEY.fullmatch(secret_key):
                raise JobSpecError(f"invalid Secret key {quote(secret_key)} in --secret-env {key}: "
                                   "letters, digits, '-', '_' and '.'")
            if own_secret(secret):
                raise JobSpecError(f"--secret-env {key}={secret}/{secret_key}: {secret} is a Secret of "
                                   "paddlecloud's own (the etcd admin's, etcd's TLS, the autoscaler's, or a "
                                   "job's NAME-tokens / NAME-etcd): a job's programs may not read it")
        for key in [k for k, _ in self.env] + [k for k, _, _ in self.secret_env]:
            if not _ENV_NAME.fullmatch(key):
                raise JobSpecError(
                    f"invalid environment variable name {quote(key)}: use letters, digits, '_', '-' "
                    "and '.', not starting with a digit"
                )
            if key in RESERVED_ENV:
                raise JobSpecError(
                    f"environment variable {key} is set by paddlecloud itself (docs/design.md "
                    "section 8); remove it from -e/--env/--secret-env"
                )
            if key in seen:
                raise JobSpecError(f"environment variable {key} is given twice")
            seen.add(key)


@dataclass(frozen=True)
class Topology:
    """How many of each role run, and the PaddleJob's pod templates that replace paddlecloud's.

    `ps_template`/`worker_template`/`heter_template` are pod templates from a `PaddleJob`;
    when set, they replace the pods paddlecloud would build from `image`/`module`/resources
    (paddlecloud still injects its environment, labels and volumes into them), and each
    keeps the `schedulerName` it was written with. `min_trainers`/`max_trainers` are the
    trainer range (None: equal to `trainers`); the master keeps the size within it.
    """

    trainers: int = job_field(
        1, kind="count", minimum=1,
        help="Number of trainers at start  [default: 1; --max-trainers if given]",
        flag="trainers", paddlejob="spec.worker.replicas", api="trainers", local="trainers")
    min_trainers: int | None = job_field(
        None, kind="count", minimum=1,
        help="Elastic: the fewest trainers `job scale` may set  [default: --trainers]",
        flag="min_trainers", paddlejob="spec.worker.requests", api="min_trainers",
        local="min_trainers")
    max_trainers: int | None = job_field(
        None, kind="count", minimum=1, help="Elastic: the most trainers  [default: --trainers]",
        flag="max_trainers", paddlejob="spec.worker.limits", api="max_trainers",
        local="max_trainers")
    pservers: int = job_field(
        0, kind="count", minimum=0, help="Number of pservers (0: collective)  [default: 0]",
        flag="pservers", paddlejob="spec.ps.replicas", api="pservers", local="pservers")
    heters: int = job_field(
        0, kind="count", minimum=0, help="Heterogeneous PS: heter trainers (spec.heter).",
        paddlejob="spec.heter.replicas",
        not_at={CLI: _NEEDS_TEMPLATES, API: _NEEDS_TEMPLATES, SERVER: _NEEDS_TEMPLATES,
                LOCAL: _NEEDS_TEMPLATES})
    ps_template: Mapping[str, Any] | None = job_field(
        None, kind="template", repr=False, help="The pservers' PodTemplateSpec.",
        paddlejob="spec.ps.template",
        not_at={CLI: "-f gives it", API: "the server builds the pods", SERVER: "the server builds "
                "the pods", LOCAL: _ONE_MACHINE})
    worker_template: Mapping[str, Any] | None = job_field(
        None, kind="template", repr=False, help="The trainers' PodTemplateSpec.",
        paddlejob="spec.worker.template",
        not_at={CLI: "-f gives it", API: "the server builds the pods", SERVER: "the server builds "
                "the pods", LOCAL: _ONE_MACHINE})
    heter_template: Mapping[str, Any] | None = job_field(
        None, kind="template", repr=False, help="The heter trainers' PodTemplateSpec.",
        paddlejob="spec.heter.template",
        not_at={CLI: "-f gives it", API: "the server builds the pods", SERVER: "the server builds "
                "the pods", LOCAL: _ONE_MACHINE})

    def validate(self) -> None:
        _check_count("trainers", self.trainers, minimum=1)
        _check_count("pservers", self.pservers, minimum=0)
        _check_count("heter trainers", self.heters, minimum=0)
        for bound in ("min_trainers", "max_trainers"):
            if getattr(self, bound) is not None:
                _check_count(bound, getattr(self, bound), minimum=1)
        try:
            self.trainer_range  # noqa: B018 (validates the range and `trainers` in it)
        except RangeError as error:
            raise JobSpecError(str(error)) from None
        if self.heters and not self.pservers:
            raise JobSpecError(
                f"{self.heters} heter trainers but no pservers: heterogeneous PS (spec.heter) "
                "needs spec.ps"
            )
        if self.heters and self.heter_template is None:
            raise JobSpecError("heter trainers need a pod template (PaddleJob spec.heter.template)")
        if self.pservers and self.ps_template is None and self.worker_template is not None:
            raise JobSpecError("a PaddleJob with pservers needs spec.ps.template")

    @property
    def trainer_range(self) -> TrainerRange:
        """min_trainers..max_trainers (both `trainers` for a fixed job)."""
        return TrainerRange.of(trainers=self.trainers, minimum=self.min_trainers,
                               maximum=self.max_trainers)[0]


@dataclass(frozen=True)
class Resources:
    """What each trainer and pserver asks of a node (PaddleJob templates say their own)."""

    trainer_cpu: str = job_field(
        "1", help="CPU per trainer, e.g. 4 or 500m  [default: 1]", flag="trainer_cpu",
        api="cpu_num", not_at={PADDLEJOB: _TEMPLATES_SAY, LOCAL: _LOCAL_IS_PRIVATE})
    trainer_memory: str = job_field(
        "2Gi", help="Memory per trainer, e.g. 8Gi  [default: 2Gi]", flag="trainer_memory",
        api="memory", not_at={PADDLEJOB: _TEMPLATES_SAY, LOCAL: _LOCAL_IS_PRIVATE})
    trainer_gpu: int = job_field(
        0, kind="count", minimum=0, help="GPUs per trainer  [default: 0]", flag="trainer_gpu",
        api="gpu_num", not_at={PADDLEJOB: _TEMPLATES_SAY, LOCAL: _LOCAL_IS_PRIVATE})
    pserver_cpu: str = job_field(
        "1", help="CPU per pserver  [default: 1]", flag="pserver_cpu", api="pserver_cpu",
        not_at={PADDLEJOB: _TEMPLATES_SAY, LOCAL: _LOCAL_IS_PRIVATE})
    pserver_memory: str = job_field(
        "2Gi", help="Memory per pserver  [default: 2Gi]", flag="pserver_memory",
        api="pserver_memory", not_at={PADDLEJOB: _TEMPLATES_SAY, LOCAL: _LOCAL_IS_PRIVATE})

    def validate(self) -> None:
        _check_count("trainer GPUs", self.trainer_gpu, minimum=0)
        for what, value in (("trainer CPU", self.trainer_cpu), ("pserver CPU", self.pserver_cpu),
                            ("trainer memory", self.trainer_memory),
                            ("pserver memory", self.pserver_memory)):
            if not isinstance(value, str) or not _QUANTITY.fullmatch(value):
                raise JobSpecError(
                    f"invalid {what} {quote(str(value))}: use a Kubernetes quantity such as '2', "
                    "'500m', '4Gi' or '512Mi'"
                )


@dataclass(frozen=True)
class Scheduling:
    """Where and when the pods run: pod cleanup, the network, Volcano's gang, Kueue's queue."""

    clean_pod_policy: str = job_field(
        "OnCompletion", kind="choice", choices=CLEAN_POD_POLICIES,
        help="Which ending removes the pods (as paddle-operator)  [default: OnCompletion]",
        flag="clean_pod_policy", paddlejob="spec.cleanPodPolicy", api="clean_pod_policy",
        not_at={LOCAL: "the local supervisor stops its processes when the job ends"})
    scheduler_name: str = job_field(
        "", help="The scheduler of pods built without a template.",
        not_at={CLI: "each pod template names its scheduler (schedulerName)",
                PADDLEJOB: "each pod template names its scheduler (schedulerName)",
                API: "the default scheduler", SERVER: "the default scheduler",
                LOCAL: _ONE_MACHINE})
    queue: str = job_field(  # Volcano queue (PaddleJob spec.schedulingPolicy.queue)
        "", help="The Volcano queue.", paddlejob="spec.schedulingPolicy.queue",
        not_at={CLI: _VOLCANO, API: _VOLCANO, SERVER: _VOLCANO, LOCAL: _ONE_MACHINE})
    priority_class: str = job_field(
        "", help="The PodGroup's priorityClassName.", paddlejob="spec.schedulingPolicy.priorityClass",
        not_at={CLI: _VOLCANO, API: _VOLCANO, SERVER: _VOLCANO, LOCAL: _ONE_MACHINE})
    min_resources: Mapping[str, str] | None = job_field(
        None, kind="mapping", help="The PodGroup's minResources.",
        paddlejob="spec.schedulingPolicy.minResources",
        not_at={CLI: _VOLCANO, API: _VOLCANO, SERVER: _VOLCANO, LOCAL: _ONE_MACHINE})
    min_member: int = job_field(  # Volcano PodGroup minMember (0: every pod of the job)
        0, kind="count", minimum=0, help="The PodGroup's minMember (0: every pod of the job).",
        paddlejob="spec.schedulingPolicy.minAvailable",
        not_at={CLI: _VOLCANO, API: _VOLCANO, SERVER: _VOLCANO, LOCAL: _ONE_MACHINE})
    podgroup_name: str = job_field(  # "" = the job's name
        "", help="The PodGroup's name when a document names one.",
        paddlejob="PodGroup metadata.name",
        not_at={CLI: _VOLCANO, API: _VOLCANO, SERVER: _VOLCANO, LOCAL: _ONE_MACHINE})
    intranet: str = job_field(
        "PodIP", kind="choice", choices=INTRANETS, help="How pods address each other.",
        paddlejob="spec.intranet",
        not_at={CLI: _OPERATOR_KEY, API: _OPERATOR_KEY, SERVER: _OPERATOR_KEY, LOCAL: _ONE_MACHINE})
    with_gloo: int = job_field(
        0, kind="choice", choices=(0, 1, 2), help="0 off, 1 trainers, 2 trainers and pservers.",
        paddlejob="spec.withGloo",
        not_at={CLI: _OPERATOR_KEY, API: _OPERATOR_KEY, SERVER: _OPERATOR_KEY, LOCAL: _ONE_MACHINE})
    host_port: int = job_field(  # Host intranet: the job's first host port (0: chosen from the name)
        0, kind="count", minimum=0, help="Host intranet: the job's first host port.",
        not_at={CLI: "chosen from the job's name", PADDLEJOB: "chosen from the job's name",
                API: "chosen from the job's name", SERVER: "chosen from the job's name",
                LOCAL: _ONE_MACHINE})
    # Kueue's LocalQueue: the job runs once Kueue admits it (docs/kubernetes.md, "Kueue")
    local_queue: str = job_field(
        "", metavar="NAME",
        help="Queue the job in Kueue's LocalQueue NAME: with -f, the PaddleJob is created "
             "labelled kueue.x-k8s.io/queue-name for `paddlecloud operator` to run once Kueue "
             "admits it (docs/kubernetes.md, Kueue).",
        flag="queue", paddlejob="metadata.labels[kueue.x-k8s.io/queue-name]", api="queue",
        not_at={LOCAL: _ONE_MACHINE})
    suspend: bool = job_field(
        False, kind="flag", own=True, paddlejob="spec.suspend",
        help="Batch Job semantics: while true no pserver or trainer runs; a running job drains, "
             "saves and stops (no failure counted) and resumes at its checkpoint when false.",
        not_at={CLI: "`kubectl patch` the job's PaddleJob to suspend or resume it",
                API: "a job is suspended by patching its PaddleJob",
                SERVER: "a job is suspended by patching its PaddleJob",
                LOCAL: "stop the local job with Ctrl-C; it resumes at its checkpoint"})

    def validate(self) -> None:
        _check_count("PodGroup minMember", self.min_member, minimum=0)
        if self.host_port and not HOST_PORT_RANGE[0] <= self.host_port < HOST_PORT_RANGE[1]:
            raise JobSpecError(
                f"invalid host port {self.host_port}: use {HOST_PORT_RANGE[0]}.."
                f"{HOST_PORT_RANGE[1] - 1}"
            )
        if self.clean_pod_policy not in CLEAN_POD_POLICIES:
            raise JobSpecError(
                f"invalid cleanPodPolicy {quote(str(self.clean_pod_policy))}: use one of "
                f"{', '.join(CLEAN_POD_POLICIES)}"
            )
        if self.intranet not in INTRANETS:
            raise JobSpecError(
                f"unsupported intranet {quote(str(self.intranet))}: use one of {', '.join(INTRANETS)}"
            )
        if self.with_gloo not in (0, 1, 2):
            raise JobSpecError(
                f"invalid withGloo {self.with_gloo!r:.20}: use 0 (off), 1 (trainers) or 2 (trainers "
                "and pservers)"
            )
        if self.scheduler_name and not _DNS_1123_SUBDOMAIN.fullmatch(self.scheduler_name):
            raise JobSpecError(f"invalid schedulerName {quote(self.scheduler_name)}")
        if self.local_queue and (len(self.local_queue) > 63
                                 or not _DNS_1123_LABEL.fullmatch(self.local_queue)):
            raise JobSpecError(
                f"invalid Kueue queue name {quote(self.local_queue)}: a LocalQueue's name, at most "
                "63 lower-case letters, digits and '-' (also a valid label value), e.g. 'team-a'")

    @property
    def gang_settings(self) -> bool:
        """Any of Volcano's gang settings given (they need Volcano)."""
        return bool(self.queue or self.priority_class or self.min_resources or self.min_member
                    or self.podgroup_name)


@dataclass(frozen=True)
class Data:
    """What the master deals out: the input, its format and chunking, the order, the output."""

    inputs: tuple[str, ...] = job_field(
        (), kind="paths", own=True,
        help="Input path or glob inside the pods, or a URL (repeatable; PADDLECLOUD_INPUT).",
        flag="inputs", flag_names=("--input",), paddlejob="spec.input", api="input", local="inputs")
    output: str = job_field(
        "", own=True, help="Where trainers write models (PADDLECLOUD_OUTPUT).", flag="output",
        paddlejob="spec.output", api="output", local="output")
    epochs: int = job_field(
        1, kind="count", minimum=1, own=True,
        help="Passes over the input (epochs 0..N-1)  [default: 1]", flag="epochs",
        paddlejob="spec.epochs", api="epochs", local="epochs")
    data_format: str = job_field(
        "lines", kind="choice", choices=DATA_FORMATS, own=True,
        help="Input format: lines (csv, tsv, jsonl, text) or file  [default: lines]",
        flag="data_format", flag_names=("--format",), paddlejob="spec.format", api="format", local="data_format")
    chunk_bytes: int = job_field(  # 0: the master's default (64 MiB)
        0, kind="size", own=True, metavar="SIZE",
        help="Size of a data chunk, e.g. 64MiB or 1GiB  [default: 64MiB]", flag="chunk_bytes",
        paddlejob="spec.chunkBytes", api="chunk_bytes", local="chunk_bytes")
    shuffle_seed: int = job_field(
        0, kind="integer", own=True, metavar="SEED",
        help="Seed of the order tasks are dealt in, each epoch (the same seed, the same "
             "order)  [default: 0]",
        flag="shuffle_seed", paddlejob="spec.shuffleSeed", api="shuffle_seed", local="shuffle_seed")
    data_volume: DataVolume | None = job_field(
        None, kind="volume", own=True, metavar="CLAIM:PATH",
        help="A PVC mounted at PATH in the master (read-only) and every trainer.",
        flag="data_volume", paddlejob="spec.dataVolume", api="data_volume",
        not_at={LOCAL: "local files are read where they are"})

    def validate(self) -> None:
        _check_count("epochs", self.epochs, minimum=1)
        _check_count("chunk bytes", self.chunk_bytes, minimum=0)
        if isinstance(self.shuffle_seed, bool) or not isinstance(self.shuffle_seed, int):
            raise JobSpecError(f"invalid shuffle seed {self.shuffle_seed!r:.40}: must be an integer")
        if self.data_format not in DATA_FORMATS:
            raise JobSpecError(
                f"invalid format {quote(str(self.data_format))}: use one of {', '.join(DATA_FORMATS)}"
            )
        for pattern in self.inputs:
            if not pattern or not (pattern.startswith("/") or "://" in pattern):
                raise JobSpecError(
                    f"invalid input {quote(pattern)}: on Kubernetes an input is an absolute path "
                    "inside the pods (e.g. under the --data-volume mount path) or a URL such as "
                    "s3://bucket/train/*.csv"
                )
        if self.data_volume is not None:
            self.data_volume.validate()


@dataclass(frozen=True)
class Recovery:
    """How a job survives losing trainers: restarts, and paddle-operator's elastic level."""

    restart_limit: int = job_field(
        3, kind="count", minimum=0, own=True,
        help="Restarts of the trainer group after a lost trainer before the job fails  [default: 3]",
        flag="restart_limit", paddlejob="spec.restartLimit", api="restart_limit",
        local="restart_limit")
    elastic: int | None = job_field(  # kept as given: paddlecloud's elasticity is the trainer range
        None, kind="count", minimum=0, help="paddle-operator's elastic level, kept as given.",
        paddlejob="spec.elastic",
        not_at={CLI: _OPERATOR_KEY, API: _OPERATOR_KEY, SERVER: _OPERATOR_KEY, LOCAL: _OPERATOR_KEY})

    def validate(self) -> None:
        _check_count("restarts (restart limit)", self.restart_limit, minimum=0)


@dataclass(frozen=True)
class Security:
    """As whom users' containers run, and whether their templates may ask for more."""

    security_profile: str = job_field(
        "default", kind="choice", choices=SECURITY_PROFILES, own=True,
        help="Run the programs under the restricted Pod Security Standard: as --run-as-user, "
             "never root (the image must allow it). Default: as the image's user.",
        flag="restricted", flag_value="restricted", paddlejob="spec.securityProfile",
        api="security_profile",
        not_at={LOCAL: _LOCAL_IS_PRIVATE})
    run_as_user: int = job_field(
        DEFAULT_RUN_AS_USER, kind="count", minimum=1, own=True, metavar="UID",
        help=f"The uid of --restricted  [default: {DEFAULT_RUN_AS_USER}]", flag="run_as_user",
        paddlejob="spec.runAsUser", api="run_as_user", not_at={LOCAL: _LOCAL_IS_PRIVATE})
    allow_privileged: bool = job_field(
        False, kind="flag", flag="allow_privileged",
        help="Let the PaddleJob's pod templates ask for privileged, host namespaces, hostPath, "
             "root or a service account (refused otherwise).",
        not_at={PADDLEJOB: "the submitter's choice, not the document's: job submit -f "
                           "--allow-privileged", API: _NO_TEMPLATES, SERVER: _NO_TEMPLATES,
                LOCAL: _LOCAL_IS_PRIVATE})

    def validate(self) -> None:
        if self.security_profile not in SECURITY_PROFILES:
            raise JobSpecError(f"invalid security profile {quote(str(self.security_profile))}: use "
                               f"{' or '.join(SECURITY_PROFILES)}")
        _check_count("run-as user (uid)", self.run_as_user, minimum=1)
        if self.run_as_user != DEFAULT_RUN_AS_USER and self.security_profile != "restricted":
            raise JobSpecError(
                f"run-as user {self.run_as_user} is the restricted profile's uid: add "
                "--restricted (PaddleJob spec.securityProfile: restricted), or drop it and the "
                "programs run as their images' users"
            )


SECTIONS: dict[str, type] = {"workload": Workload, "topology": Topology, "resources": Resources,
                             "scheduling": Scheduling, "data": Data, "recovery": Recovery,
                             "security": Security}
# flat field name -> its section's name
SECTION_OF: dict[str, str] = {f.name: section for section, cls in SECTIONS.items()
                              for f in dataclasses.fields(cls)}


def job_fields() -> Iterator[dataclasses.Field]:
    """Every field of the job model, section by section."""
    for cls in SECTIONS.values():
        yield from dataclasses.fields(cls)


def field_of(name: str) -> dataclasses.Field:
    return next(f for f in dataclasses.fields(SECTIONS[SECTION_OF[name]]) if f.name == name)
