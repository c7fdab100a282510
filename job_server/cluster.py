"""The job server's side of the cluster: submit, list, read and delete jobs by name.

Submitting renders the job as `paddlecloud job submit` does
(`manifests.submit_objects`) and creates it with the same function
(`paddlecloud.backends.k8s.jobs.create_job`). With a builder configured, the package is
built into a runtime image first (`build_image`, `paddlecloud.backends.k8s.image_build`;
skipped when the store recorded that image) and the pods run that image; without
one, the package ships in a ConfigMap, as `job submit`'s does. The master runs the
server's `paddlecloud_image`, never the request's base image (issue 34).
With `paddlejobs: true` in the configuration (where the operator runs), a job with
no package ConfigMap goes in as a PaddleJob, and the operator creates its master.
The calls block: FastAPI runs the routes that use them in its thread pool.

What this does NOT guarantee: the epoch progress of a job whose master is not
reachable from the server (it is then left out); deleting clears the job's etcd
keys only when the etcd of its spec answers (the objects go regardless).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from paddlecloud.backends.k8s import image_build, jobs, manifests
from paddlecloud.jobrequest import TrainerJob
from paddlecloud.jobspec import DEFAULT_IMAGE, JobSpec

logger = logging.getLogger(__name__)

SERVER_RIGHTS = ("The job server's rights come from its Role (deploy/components/job-server/job-server.yaml); "
                 "grant it in this namespace")


class Cluster:
    """One API client, and the build settings (None: packages ship in ConfigMaps)."""

    def __init__(self, api: Any, *, build: image_build.BuildConfig | None,
                 paddlejobs: bool = False, paddlecloud_image: str = DEFAULT_IMAGE) -> None:
        self.api, self.build, self.paddlejobs = api, build, paddlejobs
        self.paddlecloud_image = paddlecloud_image  # the server's, whatever a request's base_image

    def build_image(self, tag: str, *, context: str) -> str:
        """Builds (or waits for the build Job of) image `tag`; returns its reference."""
        if self.build is None:
            raise RuntimeError("Cluster.build_image needs a build configuration")
        return image_build.run_build(self.api, self.build, tag=tag, context=context)

    def submit(self, job: TrainerJob, *, namespace: str, package_key: str,
               files: Mapping[str, bytes] | None, image: str | None = None) -> JobSpec:
        """Creates the job: its pods run `image` (the package built in), or, without one,
        the package `files` ship in a ConfigMap."""
        ship = files is not None and image is None
        spec = dataclasses.replace(job, namespace=namespace).to_spec(
            image=image, paddlecloud_image=self.paddlecloud_image, package_path=f"package:{package_key[:12]}" if ship else "",
            package_files=tuple(sorted(files)) if ship and files else ())
        objects = manifests.submit_objects(spec, files if ship else None)
        manifests.master_objects(spec, None)  # renders the pods now: template errors surface here
        if not ship and self.paddlejobs:
            jobs.create_paddlejob(self.api, spec=spec, rights=SERVER_RIGHTS)  # the operator's
        else:
            jobs.create_job(self.api, spec=spec, objects=objects, rights=SERVER_RIGHTS)
        return spec

    def list(self, namespace: str) -> list[dict[str, Any]]:
        return jobs.list_jobs(self.api, namespace, rights=SERVER_RIGHTS, paddlejobs=self.paddlejobs)

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return jobs.job_status(self.api, namespace=namespace, name=name, rights=SERVER_RIGHTS,
                               paddlejobs=self.paddlejobs)

    def delete(self, namespace: str, name: str) -> list[str]:
        return jobs.delete_job(self.api, namespace=namespace, name=name, rights=SERVER_RIGHTS,
                               paddlejobs=self.paddlejobs)

    def viewer_token(self, namespace: str, name: str) -> str | None:
        """The job's viewer token from its Secret `NAME-tokens`; None when there is none."""
        return jobs.viewer_token(self.api, namespace=namespace, name=name, rights=SERVER_RIGHTS)

    def log(self, namespace: str, name: str, *, role: str, index: int, tail_lines: int) -> str | None:
        return jobs.pod_log(self.api, name=name, namespace=namespace, role=role, index=index,
                            tail_lines=tail_lines, rights=SERVER_RIGHTS)
