"""`POST /v1/trainer/job`, `GET /v1/jobs`, `GET|DELETE /v1/jobs/{name}`, `GET /v1/jobs/{name}/logs`."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Path, Query, Request, status
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel

from job_server.auth import Caller
from job_server.config import Quotas
from job_server.models import (
    Deleted,
    JobList,
    JobStatus,
    JobSummary,
    SubmittedJob,
    TrainerJobRequest,
)
from paddlecloud.backends.k8s import image_build
from paddlecloud.backends.k8s.jobs import JobCreateError, JobStateLeft
from paddlecloud.jobrequest import TrainerJob
from paddlecloud.jobspec import MAX_NAME_LENGTH, JobSpecError
from paddlecloud.trainer_package import entry_point
from paddlecloud.untrusted import quote

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/v1", tags=["jobs"])

NAMESPACE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
JOB_NAME = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
Namespace = Annotated[str | None, Query(max_length=63, pattern=NAMESPACE,
                                        description="Default: the token's first namespace.")]
RETRY_DELETE_AFTER_S = 10  # a delete whose etcd did not answer: when to try again
JobName = Annotated[str, Path(max_length=MAX_NAME_LENGTH, pattern=JOB_NAME)]


def check_quotas(job: TrainerJob, quotas: Quotas) -> None:
    """403 naming the limit when the job asks for more than a quota allows."""
    most = max(job.trainers, job.max_trainers)
    if quotas.max_trainers_per_job and most > quotas.max_trainers_per_job:
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            f"quota exceeded: {most} trainers asked, the limit "
                            f"max_trainers_per_job is {quotas.max_trainers_per_job}")
    gpus = most * job.gpus_per_trainer
    if quotas.max_gpus_per_job and gpus > quotas.max_gpus_per_job:
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            f"quota exceeded: {gpus} GPUs asked ({most} trainers x "
                            f"{job.gpus_per_trainer}), the limit max_gpus_per_job is "
                            f"{quotas.max_gpus_per_job}")


def allowed_etcd_endpoints(body: BaseModel, allowed: tuple[str, ...]) -> str:
    """The job's etcd: the server's first when the request names none, the one it names when
    the server allows it; 403 otherwise (a master holding the namespace's etcd credentials
    must not dial an address a submitter chose: issue 34)."""
    if "etcd_endpoints" not in body.model_fields_set:
        return allowed[0]
    given = str(getattr(body, "etcd_endpoints", ""))
    if given in allowed:
        return given
    raise HTTPException(status.HTTP_403_FORBIDDEN,
                        f"etcd_endpoints {quote(given)} is not one this server allows (its "
                        f"configuration's etcd_endpoints: {', '.join(allowed)}): leave it out")


def entry_module(job: TrainerJob, files: Mapping[str, bytes]) -> str:
    """The module the job's trainers run: `module` found in the package, or the package's
    train.py or trainer.py (seed 001's trainer_package as the entry point); a 422 naming what
    was looked for otherwise (the base image is PaddlePaddle's, seed 001: the trainer's code is
    the package's)."""
    try:
        return entry_point(job.module, files, folder="",
                           where=f"trainer_package {job.trainer_package[:12]}").module
    except JobSpecError as error:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(error)) from None


def _api_error(error: JobCreateError) -> HTTPException:
    if error.status == 409:
        return HTTPException(status.HTTP_409_CONFLICT, str(error))
    if isinstance(error, image_build.ImageBuildError):
        return HTTPException(error.status or status.HTTP_422_UNPROCESSABLE_CONTENT, str(error))
    return HTTPException(status.HTTP_502_BAD_GATEWAY, f"the Kubernetes API: {error}")


def runtime_image(state: Any, job: TrainerJob, files: Mapping[str, bytes]) -> str:
    """The image of the job's package on its base image: the one the store recorded, or a
    new build, recorded once it succeeded (the build Job is deleted a day after it ends;
    the record stays, so the pair is not built again)."""
    config = state.config.build
    tag = image_build.image_tag(job.trainer_package, job.base_image)
    wanted = image_build.image_ref(config, tag)
    if state.store.recorded_image(tag) == wanted:  # one of an older registry: build here again
        logger.info("image %s was built before: reusing it", wanted)
        return wanted
    context = state.store.put_context(tag, image_build.context_archive(files, job.base_image))
    image = state.cluster.build_image(tag, context=context)
    state.store.record_image(tag, image)
    return image


@router.post("/trainer/job", response_model=SubmittedJob, status_code=status.HTTP_201_CREATED,
             responses={403: {"description": "A quota, etcd endpoints the server does not allow, "
                                             "or a namespace the token may not use"},
                        409: {"description": "A job of that name exists"},
                        422: {"description": "A bad value, an unknown package, a failed build"}})
def submit_job(request: Request, caller: Caller, body: TrainerJobRequest) -> SubmittedJob:
    """Create a job, exactly as `paddlecloud job submit` does (building its image first when
    the server has a builder)."""
    state = request.app.state
    job = body.to_job()
    namespace = caller.namespace(job.namespace or None)
    check_quotas(job, state.config.quotas)
    job = dataclasses.replace(job, etcd_endpoints=allowed_etcd_endpoints(
        body, state.config.etcd_endpoints))
    files = image = None
    if job.trainer_package:
        try:
            files = state.store.get(job.trainer_package)
        except KeyError:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                                f"unknown trainer_package {job.trainer_package[:16]!r}: upload it "
                                "with POST /v1/package and give its digest") from None
    if files is not None:
        job = dataclasses.replace(job, module=entry_module(job, files))
    try:
        if files is not None and state.config.build is not None:
            image = runtime_image(state, job, files)
        spec = state.cluster.submit(job, namespace=namespace, package_key=job.trainer_package,
                                    files=files, image=image)
    except JobSpecError as error:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(error)) from None
    except JobCreateError as error:
        raise _api_error(error) from None
    logger.info("job %s submitted to %s (image %s)", spec.name, namespace, spec.image)
    return SubmittedJob(name=spec.name, namespace=namespace, image=spec.image)


@router.get("/jobs", response_model=JobList)
@router.get("/jobs/", response_model=JobList, include_in_schema=False)  # seed 001's path, answered as is
def list_jobs(request: Request, caller: Caller, namespace: Namespace = None,
              limit: Annotated[int, Query(ge=1, le=500)] = 100,
              after: Annotated[str | None, Query(max_length=MAX_NAME_LENGTH,
                                                 description="The last name of the previous page.")] = None
              ) -> JobList:
    """The jobs of a namespace, by name, a page at a time."""
    ns = caller.namespace(namespace)
    try:
        jobs = request.app.state.cluster.list(ns)
    except JobCreateError as error:
        raise _api_error(error) from None
    rest = [j for j in jobs if after is None or j["name"] > after]
    page = rest[:limit]
    return JobList(items=[JobSummary(**j) for j in page],
                   next_after=page[-1]["name"] if len(rest) > limit else None)


@router.get("/jobs/{name}", response_model=JobStatus, responses={404: {"description": "No such job"}})
def get_job(request: Request, caller: Caller, name: JobName, namespace: Namespace = None) -> JobStatus:
    """Phase, pods per role, and the master's epoch progress."""
    ns = caller.namespace(namespace)
    try:
        found = request.app.state.cluster.get(ns, name)
    except JobCreateError as error:
        raise _api_error(error) from None
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job {name} not found in namespace {ns}")
    return JobStatus(**found)


@router.delete("/jobs/{name}", response_model=Deleted, responses={
    404: {"description": "No such job"},
    503: {"description": "The job's objects went but its etcd keys could not be cleared (its "
                         "etcd did not answer): the message says what went; delete it again"}})
def delete_job(request: Request, caller: Caller, name: JobName, namespace: Namespace = None) -> Deleted:
    """Delete a job: its master (and so everything it owns), its ConfigMaps, its etcd keys.
    Until its etcd keys are gone (503 while its etcd does not answer) the job's spec ConfigMap
    stays, so the delete can be retried and the name is not reused over the old keys."""
    ns = caller.namespace(namespace)
    try:
        deleted = request.app.state.cluster.delete(ns, name)
    except JobStateLeft as error:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(error),
                            headers={"Retry-After": str(RETRY_DELETE_AFTER_S)}) from None
    except JobCreateError as error:
        raise _api_error(error) from None
    if not deleted:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job {name} not found in namespace {ns}")
    return Deleted(deleted=deleted)


@router.get("/jobs/{name}/logs", response_class=PlainTextResponse,
            responses={200: {"content": {"text/plain": {}}}, 404: {"description": "No such pod"}})
def get_job_logs(request: Request, caller: Caller, name: JobName, namespace: Namespace = None,
                 role: Literal["trainer", "pserver", "master"] = "trainer",
                 index: Annotated[int, Query(ge=0, le=100_000)] = 0,
                 tail: Annotated[int, Query(ge=1, le=10_000)] = 200) -> PlainTextResponse:
    """The last lines of one pod's log: trainer `index`, pserver `index`, or master (0: leader)."""
    ns = caller.namespace(namespace)
    try:
        text = request.app.state.cluster.log(ns, name, role=role, index=index, tail_lines=tail)
    except JobCreateError as error:
        raise _api_error(error) from None
    if text is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND,
                            f"no {role} pod with index {index} for job {name} in namespace {ns}")
    return PlainTextResponse(text)
