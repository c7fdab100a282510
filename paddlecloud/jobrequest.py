"""`TrainerJob`: a job in the parameters of PaddlePaddle cloud's Python API, generated from `JobSpec`.

The Job Server's `POST /v1/trainer/job` body and the Python API's `PaddleJob` are
both this one value, and it is generated from the job model: one parameter for every
field whose `Doors.api` names one (with the field's help), so a field added to the
model is a parameter of both without a line here. PaddlePaddle cloud's names and
meanings stay: `job_name`, `base_image`, `trainer_package` (the entry point: its `train.py`
or `trainer.py` unless `module` names one, `paddlecloud.trainer_package`), `input` (one
directory, path or URL, or a list of them); `memory` and
`cpu_num` size every trainer and, unless `pserver_memory`/`pserver_cpu` are given,
every pserver; `use_gpu` gives each trainer `gpu_num` GPUs; `min_trainers` and
`max_trainers` 0 mean `trainers`; `volume` is a claim mounted at `/VOLUME` (seed
001's `volume="quickstart"` with `input="/quickstart/input"`), `data_volume` any
`CLAIM:PATH`. `to_spec` maps it onto the `JobSpec` and `from_spec` back, losslessly
for every field the API carries; `JobSpec.validate` checks it all with errors naming
the bad value.

What this does NOT guarantee: that the package, the input or the image exist —
the server and the cluster find that out.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from paddlecloud.jobfields import SERVER, doors_of
from paddlecloud.jobspec import (
    DEFAULT_IMAGE,
    DataVolume,
    JobSpec,
    JobSpecError,
    chunk_bytes,
    job_fields,
)
from paddlecloud.untrusted import quote

logger = logging.getLogger(__name__)

_TYPES: dict[str, Any] = {"text": str, "directory": str, "choice": str, "count": int,
                          "integer": int, "flag": bool, "size": int | str,
                          "paths": tuple[str, ...], "pairs": Mapping[str, str], "volume": str}
# where a PaddlePaddle cloud parameter differs from its field in the model: type, default, help
_API_DIFFERENCES: dict[str, dict[str, Any]] = {
    "namespace": {"default": "", "help": "Kubernetes namespace (default: the token's first, else "
                                         "default)."},
    "min_trainers": {"default": 0, "help": "Fewest trainers (0: `trainers`)."},
    "max_trainers": {"default": 0, "help": "Most trainers (0: `trainers`)."},
    "cpu_num": {"type": int | str, "default": 1,
                "help": "CPUs of each trainer (and pserver, unless pserver_cpu), e.g. 4 or '500m'."},
    "memory": {"help": "Memory of each trainer (and pserver, unless pserver_memory)."},
    "pserver_cpu": {"default": "", "help": "CPU per pserver (default: cpu_num)."},
    "pserver_memory": {"default": "", "help": "Memory per pserver (default: memory)."},
    "gpu_num": {"default": 1, "help": "GPUs per trainer when `use_gpu`."},
    "base_image": {"help": "The image the package runs on (the runtime image is built FROM it)."},
    "data_volume": {"default": "", "help": "A PersistentVolumeClaim as CLAIM:PATH, mounted at PATH "
                                           "in the master (read-only) and every trainer."},
    "module": {"help": "Trainers run `python3 -m MODULE` (default: the trainer_package's train.py "
                       "or trainer.py)."},
    "input": {"help": "The input: a directory, path, glob or URL (seed 001: one input directory), "
                      "or a list of them."},
}
# PaddlePaddle cloud's parameters that are no field of the model by themselves
_EXTRA: dict[str, dict[str, Any]] = {
    "trainer_package": {"type": str, "default": "", "help": (
        "The package: its digest from POST /v1/package (server) or a local directory (Python "
        "API).")},
    "use_gpu": {"type": bool, "default": False, "help": "Give each trainer `gpu_num` GPUs."},
    "volume": {"type": str, "default": "", "help": (
        "A PersistentVolumeClaim mounted at /VOLUME in the master (read-only) and every trainer, "
        "where input and output point (e.g. volume quickstart, input /quickstart/input).")},
}
_REQUIRED = ("job_name",)


def api_fields() -> Iterator[tuple[str, dataclasses.Field]]:
    """(parameter, JobSpec field) of every field the API carries."""
    for f in job_fields():
        if doors_of(f).api is not None:
            yield doors_of(f).api, f


def _parameter(name: str, f: dataclasses.Field | None) -> tuple[str, Any, Any]:
    """(name, type, dataclasses.field) of one parameter: its field's kind, default and help,
    unless PaddlePaddle cloud's API says otherwise."""
    doors = doors_of(f) if f is not None else None
    model = {"type": _TYPES[doors.kind], "default": f.default, "help": doors.help} if doors else {}
    given = {**model, **_API_DIFFERENCES.get(name, {}), **_EXTRA.get(name, {})}
    kind, default, doc = given["type"], given["default"], {"doc": given["help"]}
    if name in _REQUIRED:
        return name, kind, dataclasses.field(metadata=doc)
    if kind is _TYPES["pairs"]:
        return name, kind, dataclasses.field(default_factory=dict, metadata=doc)
    return name, kind, dataclasses.field(default=default, metadata=doc)


def _parameters() -> list[tuple[str, Any, Any]]:
    params = [_parameter(name, f) for name, f in api_fields()]
    params += [_parameter(name, None) for name in _EXTRA]
    return sorted(params, key=lambda p: p[0] not in _REQUIRED)  # required ones first


def _to_spec(job: Any, *, image: str | None = None, paddlecloud_image: str = DEFAULT_IMAGE,
             package_path: str = "", package_files: tuple[str, ...] = ()) -> JobSpec:
    """The validated `JobSpec`; raises `JobSpecError` naming the first bad value. The
    master runs `paddlecloud_image` (paddlecloud's), never `base_image` (the submitter's)."""
    values = {f.name: _SPEC_VALUE.get(f.name, _as_given)(job, name) for name, f in api_fields()}
    values.update(image=image or job.base_image, paddlecloud_image=paddlecloud_image,
                  package_path=package_path, package_files=package_files)
    return JobSpec(**values).validate()


def _as_given(job: Any, name: str) -> Any:
    return getattr(job, name)


def _cpu(job: Any, name: str) -> str:
    cpu = job.cpu_num
    if isinstance(cpu, bool) or not isinstance(cpu, int | str) or (isinstance(cpu, int) and cpu < 1):
        raise JobSpecError(f"invalid cpu_num {cpu!r:.40}: give a whole number >= 1 or a quantity "
                           "such as '500m'")
    return str(cpu)


def _gpus(job: Any, name: str) -> int:
    if job.use_gpu and (not isinstance(job.gpu_num, int) or job.gpu_num < 1):
        raise JobSpecError(f"invalid gpu_num {job.gpu_num!r:.40}: use_gpu needs at least 1")
    return job.gpu_num if job.use_gpu else 0


def _data_volume(job: Any, name: str) -> DataVolume | None:
    if job.data_volume and job.volume:
        raise JobSpecError(f"volume {quote(job.volume)} and data_volume {quote(job.data_volume)} "
                           "both given: give one")
    if job.data_volume:
        return DataVolume.parse(job.data_volume)
    return DataVolume(claim=job.volume, mount_path=f"/{job.volume}") if job.volume else None


def _inputs(job: Any, name: str) -> tuple[str, ...]:
    if isinstance(job.input, str):  # seed 001: "input directory on distributed file system"
        return (job.input,) if job.input else ()
    return tuple(job.input)


# JobSpec field -> its value from the API's parameters, where it is not the parameter as given
_SPEC_VALUE: dict[str, Callable[[Any, str], Any]] = {
    "namespace": lambda job, name: job.namespace or "default",
    "min_trainers": lambda job, name: job.min_trainers or None,
    "max_trainers": lambda job, name: job.max_trainers or None,
    "trainer_cpu": _cpu,
    "pserver_cpu": lambda job, name: job.pserver_cpu or _cpu(job, name),
    "pserver_memory": lambda job, name: job.pserver_memory or job.memory,
    "trainer_gpu": _gpus,
    "env": lambda job, name: tuple(sorted((str(k), str(v)) for k, v in dict(job.env).items())),
    "inputs": _inputs,
    "chunk_bytes": lambda job, name: chunk_bytes(job.chunk_bytes, where="chunk_bytes")
    if job.chunk_bytes else 0,
    "data_volume": _data_volume,
}
# API parameter -> its value from a JobSpec, where it is not the field as it is
_API_VALUE: dict[str, Callable[[JobSpec], Any]] = {
    "min_trainers": lambda spec: spec.min_trainers or 0,
    "max_trainers": lambda spec: spec.max_trainers or 0,
    "gpu_num": lambda spec: spec.trainer_gpu or 1,
    "use_gpu": lambda spec: spec.trainer_gpu > 0,
    "input": lambda spec: spec.inputs,
    "env": lambda spec: dict(spec.env),
    "data_volume": lambda spec: str(spec.data_volume) if spec.data_volume else "",
    "volume": lambda spec: "",
    "trainer_package": lambda spec: spec.package_path,  # uploaded by the Python API
    "cpu_num": lambda spec: int(spec.trainer_cpu) if spec.trainer_cpu.isdigit() else spec.trainer_cpu,
}


def _from_spec(cls: type, spec: JobSpec) -> Any:
    """The `TrainerJob` of a `JobSpec` (e.g. `job submit`'s flags, for `--server`); raises
    `JobSpecError` naming what the Job Server's parameters cannot carry, and why."""
    fields = dict(api_fields())
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in _API_VALUE:
            values[f.name] = _API_VALUE[f.name](spec)
        elif f.name in fields:
            values[f.name] = getattr(spec, fields[f.name].name)
    job = cls(**values)
    # the server chooses paddlecloud's image; the package travels as an upload
    back = job.to_spec(package_path=spec.package_path, package_files=spec.package_files)
    lost = [f for f in job_fields() if getattr(back, f.name) != getattr(spec, f.name)]
    if lost:
        reasons = "; ".join(f"{f.name} ({doors_of(f).not_at.get(SERVER, 'not carried')})"
                            for f in lost)
        raise JobSpecError(f"the Job Server's parameters cannot carry {reasons}: submit without "
                           "--server, or drop those settings")
    return job


TrainerJob = dataclasses.make_dataclass(
    "TrainerJob", _parameters(), frozen=True,
    namespace={"__doc__": "One job as the Python API and the Job Server take it (PaddlePaddle "
                          "cloud's names), generated from the job model's fields.",
               "to_spec": _to_spec, "from_spec": classmethod(_from_spec),
               "gpus_per_trainer": property(lambda self: self.gpu_num if self.use_gpu else 0),
               "__module__": __name__})


def field_docs() -> dict[str, str]:
    """{field: description}, for the server's schema and the Python API's help."""
    return {f.name: f.metadata.get("doc", "") for f in dataclasses.fields(TrainerJob)}
