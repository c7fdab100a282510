"""The request and response models: they ARE the OpenAPI schema.

`TrainerJobRequest` is generated from `paddlecloud.jobrequest.TrainerJob` — the
value the Python API builds, itself generated from the job model (`JobSpec`'s
fields that name an API parameter), and mapped by `to_spec` onto the `JobSpec` of
`job submit` — field by field, with its defaults and descriptions, so the server,
the CLI and the Python API cannot drift apart. Its validator runs `TrainerJob.to_spec`, so a
bad value is a 422 naming it, before anything is stored or created.

What this does NOT guarantee: that the package named exists (the route checks).
"""

from __future__ import annotations

import dataclasses
import logging
import typing
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, create_model, model_validator

from paddlecloud import jobrequest
from paddlecloud.jobrequest import TrainerJob
from paddlecloud.jobspec import JobSpecError

logger = logging.getLogger(__name__)

# JSON-friendly field types of TrainerJob (tuples as lists, mappings as objects)
_JSON_TYPES: dict[str, Any] = {"input": list[str] | str, "env": dict[str, str]}
# seed 001's table spells it `base-image`; its example (and Python) `base_image`
_ALIASES: dict[str, AliasChoices] = {"base_image": AliasChoices("base_image", "base-image")}
# Stands in for the module while the rest is validated: the package's train.py or trainer.py
# gives it once the route has the package (a job with neither is refused there).
ENTRY_POINT_LATER = "entry_point_later"


class _TrainerJobBase(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _valid_as_a_job_spec(self) -> _TrainerJobBase:
        job = self.to_job()
        if not job.module and job.trainer_package:
            job = dataclasses.replace(job, module=ENTRY_POINT_LATER)
        try:
            job.to_spec()
        except JobSpecError as error:
            raise ValueError(str(error)) from None
        return self

    def to_job(self) -> TrainerJob:
        values = self.model_dump()
        given = values["input"]
        values["input"] = (given,) if isinstance(given, str) else tuple(given)
        return TrainerJob(**values)


def _request_model() -> type[BaseModel]:
    hints = typing.get_type_hints(TrainerJob, vars(jobrequest))
    docs = jobrequest.field_docs()
    definitions: dict[str, Any] = {}
    for f in dataclasses.fields(TrainerJob):
        kind = _JSON_TYPES.get(f.name, hints[f.name])
        if f.default is not dataclasses.MISSING:
            value = list(f.default) if isinstance(f.default, tuple) else f.default
            default = Field(default=value, description=docs[f.name],
                            validation_alias=_ALIASES.get(f.name))
        elif f.default_factory is not dataclasses.MISSING:
            default = Field(default_factory=f.default_factory, description=docs[f.name])
        else:
            default = Field(description=docs[f.name])
        definitions[f.name] = (kind, default)
    return create_model("TrainerJobRequest", __base__=_TrainerJobBase, **definitions)


TrainerJobRequest = _request_model()


class PackageInfo(BaseModel):
    digest: str = Field(description="The package's content hash: give it as trainer_package.")
    files: list[str]
    size: int = Field(description="Bytes of all its files.")
    reused: bool = Field(description="True when this package was stored before.")
    warnings: list[str] = Field(default_factory=list, description=(
        "What was taken other than as written, e.g. seed 001's requirments.txt read as "
        "requirements.txt."))


class SubmittedJob(BaseModel):
    name: str
    namespace: str
    image: str = Field(description="The image the job's pods run.")


class JobSummary(BaseModel):
    name: str
    namespace: str
    phase: str
    created: str


class JobList(BaseModel):
    items: list[JobSummary]
    next_after: str | None = Field(
        default=None, description="Pass as `after` for the next page; null on the last one.")


class Progress(BaseModel):
    epoch: int
    epochs: int
    tasks_done: int
    tasks: int
    trainers_alive: int


class JobStatus(BaseModel):
    name: str
    namespace: str
    phase: str
    reason: str = ""
    pods: dict[str, dict[str, int]] = Field(description="{role: {pod phase: count}}")
    progress: Progress | None = Field(
        default=None, description="The master's epoch progress; null when it is not reachable.")


class Deleted(BaseModel):
    deleted: list[str]


class Version(BaseModel):
    version: str
    api: str = "v1"
