"""`TrainerJob`: a job in the parameters of PaddlePaddle cloud's Python API, and its `JobSpec`.

The Job Server's `POST /v1/trainer/job` body and the Python API's `PaddleJob` are
both this one value (the server's request model is generated from its fields), and
`to_spec` is the one mapping onto the `JobSpec` that `paddlecloud job submit`
builds from its flags, so the three never drift: `memory` and `cpu_num` size every
trainer and pserver, `use_gpu` gives each trainer `gpu_num` GPUs, `trainers` may be
a range (`min_trainers`..`max_trainers`), `volume` is a claim mounted at `/VOLUME`
(seed 001's `volume="quickstart"` with `input="/quickstart/input"`), and
`JobSpec.validate` checks it all with errors naming the bad value.

What this does NOT guarantee: that the package, the input or the image exist —
the server and the cluster find that out.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from paddlecloud.jobspec import (
    DEFAULT_ETCD_ENDPOINTS,
    DEFAULT_IMAGE,
    DataVolume,
    JobSpec,
    JobSpecError,
)

logger = logging.getLogger(__name__)


def _doc(text: str) -> dict[str, str]:
    return {"doc": text}


@dataclass(frozen=True)
class TrainerJob:
    """One job as the Python API and the Job Server take it (PaddlePaddle cloud's names)."""

    job_name: str = field(metadata=_doc("The job's name (a DNS-1035 label, at most 40 characters)."))
    module: str = field(metadata=_doc("Trainers (and pservers) run `python3 -m MODULE`."))
    trainer_package: str = field(default="", metadata=_doc(
        "The package: its digest from POST /v1/package (server) or a local directory (Python API)."))
    input: tuple[str, ...] = field(default=(), metadata=_doc(
        "Input paths or globs inside the pods, or URLs."))
    output: str = field(default="", metadata=_doc("Where trainers write models."))
    pservers: int = field(default=0, metadata=_doc("Parameter servers (0: collective)."))
    trainers: int = field(default=1, metadata=_doc("Trainers to start with."))
    min_trainers: int = field(default=0, metadata=_doc("Fewest trainers (0: `trainers`)."))
    max_trainers: int = field(default=0, metadata=_doc("Most trainers (0: `trainers`)."))
    base_image: str = field(default=DEFAULT_IMAGE, metadata=_doc(
        "The image the package runs on (the runtime image is built FROM it)."))
    memory: str = field(default="2Gi", metadata=_doc("Memory of each trainer and pserver."))
    use_gpu: bool = field(default=False, metadata=_doc("Give each trainer `gpu_num` GPUs."))
    cpu_num: int = field(default=1, metadata=_doc("CPUs of each trainer and pserver."))
    gpu_num: int = field(default=1, metadata=_doc("GPUs per trainer when `use_gpu`."))
    env: Mapping[str, str] = field(default_factory=dict, metadata=_doc(
        "Environment of every trainer and pserver."))
    epochs: int = field(default=1, metadata=_doc("Passes over the input."))
    namespace: str = field(default="", metadata=_doc(
        "Kubernetes namespace (default: the token's first, else default)."))
    etcd_endpoints: str = field(default=DEFAULT_ETCD_ENDPOINTS, metadata=_doc(
        "The etcd the job's master keeps its state in."))
    volume: str = field(default="", metadata=_doc(
        "A PersistentVolumeClaim mounted at /VOLUME in the master (read-only) and every trainer, "
        "where input and output point (e.g. volume quickstart, input /quickstart/input)."))
    queue: str = field(default="", metadata=_doc(
        "Kueue's LocalQueue: the job goes in as a PaddleJob labelled kueue.x-k8s.io/queue-name, "
        "which `paddlecloud operator` runs once Kueue admits it (a Job Server needs "
        "`paddlejobs: true`)."))

    @property
    def gpus_per_trainer(self) -> int:
        return self.gpu_num if self.use_gpu else 0

    def to_spec(self, *, image: str | None = None, paddlecloud_image: str = DEFAULT_IMAGE,
                package_path: str = "", package_files: tuple[str, ...] = ()) -> JobSpec:
        """The validated `JobSpec`; raises `JobSpecError` naming the first bad value. The
        master runs `paddlecloud_image` (paddlecloud's), never `base_image` (the submitter's)."""
        if isinstance(self.cpu_num, bool) or not isinstance(self.cpu_num, int) or self.cpu_num < 1:
            raise JobSpecError(f"invalid cpu_num {self.cpu_num!r}: give a whole number >= 1")
        if self.use_gpu and (not isinstance(self.gpu_num, int) or self.gpu_num < 1):
            raise JobSpecError(f"invalid gpu_num {self.gpu_num!r}: use_gpu needs at least 1")
        if isinstance(self.input, str):
            raise JobSpecError(f"invalid input {self.input!r}: give a list of paths or URLs")
        spec = JobSpec(
            name=self.job_name, namespace=self.namespace or "default",
            image=image or self.base_image, paddlecloud_image=paddlecloud_image, module=self.module,
            package_path=package_path, package_files=package_files,
            inputs=tuple(self.input), output=self.output, trainers=self.trainers,
            pservers=self.pservers, min_trainers=self.min_trainers or None,
            max_trainers=self.max_trainers or None, trainer_cpu=str(self.cpu_num),
            trainer_memory=self.memory, trainer_gpu=self.gpus_per_trainer,
            pserver_cpu=str(self.cpu_num), pserver_memory=self.memory,
            env=tuple(sorted((str(k), str(v)) for k, v in dict(self.env).items())),
            etcd_endpoints=self.etcd_endpoints, epochs=self.epochs, local_queue=self.queue,
            data_volume=DataVolume(claim=self.volume, mount_path=f"/{self.volume}") if self.volume else None,
        )
        return spec.validate()

    @classmethod
    def from_spec(cls, spec: JobSpec) -> TrainerJob:
        """The `TrainerJob` of a `JobSpec` (e.g. `job submit`'s flags, for `--server`); raises
        `JobSpecError` naming what the Job Server's parameters cannot carry."""
        cpu = spec.trainer_cpu
        job = cls(
            job_name=spec.name, module=spec.module, trainer_package=spec.package_path,
            input=spec.inputs, output=spec.output, pservers=spec.pservers,
            trainers=spec.trainers, min_trainers=spec.min_trainers or 0,
            max_trainers=spec.max_trainers or 0, base_image=spec.image,
            memory=spec.trainer_memory, use_gpu=spec.trainer_gpu > 0,
            cpu_num=int(cpu) if cpu.isdigit() else 0, gpu_num=spec.trainer_gpu or 1,
            env=dict(spec.env), epochs=spec.epochs, namespace=spec.namespace,
            etcd_endpoints=spec.etcd_endpoints, volume=_volume_of(spec.data_volume),
            queue=spec.local_queue,
        )
        if job.cpu_num < 1:
            raise JobSpecError(f"trainer CPU {cpu!r}: the Job Server takes whole CPUs (cpu_num)")
        back = job.to_spec(package_path=spec.package_path, package_files=spec.package_files)
        lost = [f.name for f in dataclasses.fields(JobSpec)
                if getattr(back, f.name) != getattr(spec, f.name)]
        if lost:
            raise JobSpecError(f"the Job Server's parameters cannot carry {', '.join(lost)}: "
                               "submit without --server, or drop those settings")
        return job


def _volume_of(data_volume: DataVolume | None) -> str:
    """`volume` of a claim mounted at /CLAIM; "" otherwise (`from_spec` then names data_volume
    as what the Job Server's parameters cannot carry)."""
    if data_volume is None or data_volume.mount_path != f"/{data_volume.claim}":
        return ""
    return data_volume.claim


def field_docs() -> dict[str, str]:
    """{field: description}, for the server's schema and the Python API's help."""
    return {f.name: f.metadata.get("doc", "") for f in dataclasses.fields(TrainerJob)}
