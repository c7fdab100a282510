"""`JobSpec`: everything a paddlecloud job needs, in one frozen value of nested sections.

It is the one job model. Each section (`Workload`, `Topology`, `Resources`, `Scheduling`,
`Data`, `Recovery`, `Security`: `paddlecloud.jobspec.sections`) checks its own values;
`JobSpec.validate` checks them and what spans sections. Each field carries, once, what the front doors need
(`paddlecloud.jobfields.Doors`: its help, its kind, its name at `job submit`, in a
PaddleJob, in the Python API and the Job Server, and at `local train`, or why a door
does not take it); those doors are derived from it. The CLI builds a `JobSpec` from
`paddlecloud job submit` flags or from a paddle-operator `PaddleJob` YAML
(`paddlecloud.paddlejob`), checks it (`validate`), and stores it as flat YAML in the
job's ConfigMap (`to_yaml`); the master reads it back with `--job-spec` (`from_yaml`)
and renders the pservers and trainers from it (`paddlecloud.backends.k8s.manifests`).
Every field is also read flat (`spec.trainers` is `spec.topology.trainers`), and
`JobSpec(...)` and `replace(...)` take flat names.

What this does NOT guarantee: that the image, the claim, the scheduler or the
module named here exist in the cluster — only the API server and the kubelet can
tell. Raw pod templates from a `PaddleJob` are kept as given (dicts, to be treated
as read-only) and are checked by the API server, not here.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from paddlecloud.elastic import TrainerRange
from paddlecloud.jobfields import JobSpecError
from paddlecloud.jobspec.sections import (
    CLEAN_POD_POLICIES,
    DEFAULT_ETCD_ENDPOINTS,
    DEFAULT_IMAGE,
    HOST_PORT_RANGE,
    MAX_NAME_LENGTH,
    PADDLEJOB_API_VERSION,
    PADDLEJOB_KIND,
    SECTION_OF,
    SECTIONS,
    SPEC_VERSION,
    Data,
    DataVolume,
    Recovery,
    Resources,
    Scheduling,
    Security,
    Topology,
    Workload,
    field_of,
    job_fields,
)
from paddlecloud.podtemplates import TEMPLATE_ROLES, check_template
from paddlecloud.units import parse_key_value, parse_size
from paddlecloud.untrusted import quote

logger = logging.getLogger(__name__)

# what the rest of paddlecloud takes from the job model, wherever in the package it is defined
__all__ = ["CLEAN_POD_POLICIES", "DEFAULT_ETCD_ENDPOINTS", "DEFAULT_IMAGE", "HOST_PORT_RANGE",
           "MAX_NAME_LENGTH", "PADDLEJOB_API_VERSION", "PADDLEJOB_KIND", "SECTION_OF", "DataVolume",
           "JobSpec", "JobSpecError", "chunk_bytes", "field_of", "job_fields", "parse_env",
           "parse_secret_env"]

def _flat_property(section: str, name: str) -> property:
    return property(lambda self: getattr(getattr(self, section), name),
                    doc=f"`{section}.{name}`")


@dataclass(frozen=True, init=False)
class JobSpec:
    """One job: its sections. `JobSpec(name=..., trainers=2)` takes flat field names (or a
    whole section by its name), and every field reads flat as well (`spec.trainers`).
    Every user container runs as written (its image, command, args, working directory and
    user); paddlecloud's part runs beside it in containers of `paddlecloud_image`."""

    workload: Workload
    topology: Topology
    resources: Resources
    scheduling: Scheduling
    data: Data
    recovery: Recovery
    security: Security

    def __init__(self, **values: Any) -> None:
        unknown = sorted(set(values) - set(SECTION_OF) - set(SECTIONS))
        if unknown:
            raise TypeError(f"JobSpec got unknown field(s): {', '.join(unknown)}")
        for section, cls in SECTIONS.items():
            given = values.get(section)
            flat = {k: v for k, v in values.items() if SECTION_OF.get(k) == section}
            if given is None:
                given = cls(**flat)
            elif flat:
                given = dataclasses.replace(given, **flat)
            object.__setattr__(self, section, given)

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
        return self.topology.trainer_range

    @property
    def uses_volcano(self) -> bool:
        return any(self.written_scheduler(r) == "volcano" for r in self.roles)

    # ---- checks -----------------------------------------------------------------
    def validate(self) -> JobSpec:
        """Raises `JobSpecError` naming the first bad value; returns self for chaining."""
        for section in SECTIONS:
            getattr(self, section).validate()
        if self.worker_template is None and not self.module:
            raise JobSpecError(
                "no trainer program: give --module (run as `python3 -m MODULE`) or a PaddleJob "
                "with spec.worker.template (-f job.yaml)"
            )
        if self.pservers and self.ps_template is None and not self.module:
            raise JobSpecError(
                "no pserver program: give --module (pservers run it with TRAINING_ROLE=PSERVER) "
                "or a PaddleJob with spec.ps.template"
            )
        for field_name, role in TEMPLATE_ROLES.items():
            template = getattr(self, field_name)
            if template is not None:
                check_template(template, where=f"spec.{role}.template",
                               allow_privileged=self.allow_privileged)
        self._check_gang()
        return self

    def _check_gang(self) -> None:
        if self.scheduling.gang_settings and not self.uses_volcano:
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

    # ---- flat values and YAML (the ConfigMap content the master reads with --job-spec) ---------
    def flat(self) -> dict[str, Any]:
        """{field: value} of every field, flat."""
        return {f.name: getattr(self, f.name) for f in job_fields()}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"spec_version": SPEC_VERSION}
        for name, value in self.flat().items():
            if name == "env":
                value = {k: v for k, v in value}
            elif name == "data_volume" and value is not None:
                value = {"claim": value.claim, "mount_path": value.mount_path}
            elif isinstance(value, tuple):
                value = [list(v) if isinstance(v, tuple) else v for v in value]
            elif isinstance(value, Mapping):
                value = copy.deepcopy(dict(value))
            out[name] = value
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
                f"job spec version {version!r:.20} is not supported: this paddlecloud reads version "
                f"{SPEC_VERSION}; submit the job again with this paddlecloud"
            )
        unknown = sorted(set(data) - set(SECTION_OF))
        if unknown:
            raise JobSpecError(f"unknown job spec field(s): {', '.join(unknown)[:200]}")
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
        return JobSpec(**{section: getattr(self, section) for section in SECTIONS}, **changes)


for _name, _section in SECTION_OF.items():
    setattr(JobSpec, _name, _flat_property(_section, _name))


def parse_secret_env(pairs: Iterable[str]) -> tuple[tuple[str, str, str], ...]:
    """`["TOKEN=creds/token"]` -> `(("TOKEN", "creds", "token"),)`: NAME from Secret `creds`, key `token`."""
    out = []
    for pair in pairs:
        name, sep, ref = pair.partition("=")
        secret, slash, key = ref.partition("/")
        if not sep or not slash or not name or not secret or not key:
            raise JobSpecError(f"invalid --secret-env {quote(pair)}: use NAME=SECRET/KEY "
                               "(the Secret's key becomes NAME; its value is never in the job spec)")
        out.append((name, secret, key))
    return tuple(out)


def parse_env(pairs: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """`["A=1", "B=x=y"]` -> `(("A", "1"), ("B", "x=y"))`; errors name the bad pair."""
    try:
        return tuple(parse_key_value(pair) for pair in pairs)
    except ValueError as error:
        raise JobSpecError(f"invalid environment setting: {error}") from None


def chunk_bytes(value: Any, *, where: str = "--chunk-bytes") -> int:
    """Bytes of a chunk size (`64MiB`, `1GiB`, or an integer); errors name the value."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise JobSpecError(f"invalid {where} {value!r:.40}: use e.g. '64MiB' or a number of bytes")
    try:
        size = parse_size(value)
    except ValueError as error:
        raise JobSpecError(f"{where}: {error}") from None
    if size < 1:
        raise JobSpecError(f"invalid {where} {quote(str(value))}: a chunk holds at least 1 byte")
    return size

