"""The job server's side of the cluster: submit, list, read and delete jobs by name.

Submitting renders the job as `paddlecloud job submit` does
(`manifests.submit_objects`) and creates it with the same function
(`paddlecloud.k8s.jobs.create_job`). With a builder configured, the package is
built into a runtime image first (`paddlecloud.k8s.image_build`) and the pods run
that image; without one, the package ships in a ConfigMap, as `job submit`'s does.
The calls block: FastAPI runs the routes that use them in its thread pool.

What this does NOT guarantee: the epoch progress of a job whose master is not
reachable from the server (it is then left out); deleting clears the job's etcd
keys only when the etcd of its spec answers (the objects go regardless).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from paddlecloud.jobrequest import TrainerJob
from paddlecloud.jobspec import JobSpec, JobSpecError
from paddlecloud.k8s import image_build, manifests
from paddlecloud.k8s.jobs import call, create_job, fetch_master_status, pod_counts

logger = logging.getLogger(__name__)

SERVER_RIGHTS = ("The job server's rights come from its Role (deploy/job-server.yaml); "
                 "grant it in this namespace")
MASTER_TIMEOUT_S = 2.0
MASTER_SELECTOR = f"{manifests.APP_LABEL}={manifests.APP_NAME},{manifests.ROLE_LABEL}={manifests.MASTER}"


class Cluster:
    """One API client, and the build settings (None: packages ship in ConfigMaps)."""

    def __init__(self, api: Any, *, build: image_build.BuildConfig | None) -> None:
        self.api, self.build = api, build

    def _clients(self) -> tuple[Any, Any]:
        from kubernetes import client

        return client.CoreV1Api(self.api), client.AppsV1Api(self.api)

    def submit(self, job: TrainerJob, *, namespace: str, package_key: str,
               files: Mapping[str, bytes] | None, context: str | None) -> JobSpec:
        """Creates the job; builds its image first when a builder is configured."""
        image = None
        if files is not None and self.build is not None and context is not None:
            tag = image_build.image_tag(package_key, job.base_image)
            image = image_build.run_build(self.api, self.build, tag=tag, context=context)
        ship = files is not None and image is None
        spec = dataclasses.replace(job, namespace=namespace).to_spec(
            image=image, package_path=f"package:{package_key[:12]}" if ship else "",
            package_files=tuple(sorted(files)) if ship and files else ())
        objects = manifests.submit_objects(spec, files if ship else None)
        manifests.master_objects(spec, None)  # renders the pods now: template errors surface here
        create_job(self.api, spec=spec, objects=objects, rights=SERVER_RIGHTS)
        return spec

    def list(self, namespace: str) -> list[dict[str, Any]]:
        """Every job of a namespace, by name: {name, phase, created}."""
        _, apps = self._clients()
        found = call(apps.list_namespaced_deployment, namespace, label_selector=MASTER_SELECTOR,
                     verb="list", resource="deployments", namespace=namespace, rights=SERVER_RIGHTS)
        out = []
        for item in found.items or []:
            name = (item.metadata.labels or {}).get(manifests.JOB_LABEL)
            if name:
                out.append({"name": name, "namespace": namespace,
                            "phase": (item.metadata.annotations or {}).get(
                                manifests.PHASE_ANNOTATION, "Pending"),
                            "created": str(item.metadata.creation_timestamp or "")})
        return sorted(out, key=lambda j: j["name"])

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Phase, pods per role and the master's progress; None when there is no such job."""
        core, apps = self._clients()
        deployment = call(apps.read_namespaced_deployment, manifests.master_name(name), namespace,
                          verb="get", resource="deployments", namespace=namespace,
                          name=manifests.master_name(name), tolerate=(404,), rights=SERVER_RIGHTS)
        if deployment is None:
            return None
        pods = call(core.list_namespaced_pod, namespace,
                    label_selector=manifests.label_selector(name), verb="list", resource="pods",
                    namespace=namespace, rights=SERVER_RIGHTS)
        annotations = deployment.metadata.annotations or {}
        return {"name": name, "namespace": namespace,
                "phase": annotations.get(manifests.PHASE_ANNOTATION, "Pending"),
                "reason": annotations.get(manifests.PHASE_REASON_ANNOTATION, ""),
                "pods": pod_counts(pods.items or [], name),
                "progress": self._progress(namespace, name)}

    @staticmethod
    def _progress(namespace: str, name: str) -> dict[str, int] | None:
        import grpc

        try:
            reply = fetch_master_status(manifests.master_address(name, namespace),
                                        timeout=MASTER_TIMEOUT_S)
        except grpc.RpcError as error:
            logger.info("master of %s/%s unreachable: %s", namespace, name, error)
            return None
        if not reply.has_dataset:
            return None
        return {"epoch": reply.current_epoch, "epochs": reply.num_epochs,
                "tasks_done": reply.counts.done, "tasks": reply.num_tasks,
                "trainers_alive": reply.trainers_alive}

    def delete(self, namespace: str, name: str) -> list[str]:
        """Deletes the master (and so what it owns) and the ConfigMaps; [] when none existed."""
        from kubernetes import client

        core, apps = self._clients()
        spec_cm = call(core.read_namespaced_config_map, manifests.spec_configmap_name(name),
                       namespace, verb="get", resource="configmaps", namespace=namespace,
                       tolerate=(404,), rights=SERVER_RIGHTS)
        options = client.V1DeleteOptions(propagation_policy="Background")
        deleted = []
        for resource, fn, obj in (
            ("deployments", apps.delete_namespaced_deployment, manifests.master_name(name)),
            ("configmaps", core.delete_namespaced_config_map, manifests.spec_configmap_name(name)),
            ("configmaps", core.delete_namespaced_config_map, manifests.package_configmap_name(name)),
        ):
            if call(fn, obj, namespace, body=options, verb="delete", resource=resource,
                    namespace=namespace, name=obj, tolerate=(404,), rights=SERVER_RIGHTS) is not None:
                deleted.append(f"{resource}/{obj}")
        if deleted and spec_cm is not None and (spec_cm.data or {}).get(manifests.SPEC_KEY):
            self._clear_etcd(spec_cm.data[manifests.SPEC_KEY], namespace=namespace, name=name)
        return deleted

    @staticmethod
    def _clear_etcd(spec_yaml: str, *, namespace: str, name: str) -> None:
        from paddlecloud.etcd import connect
        from paddlecloud.keys import JobKeys

        async def clear(endpoints: str) -> None:
            etcd = await connect(endpoints, timeout=3.0)
            try:
                await etcd.delete_prefix(JobKeys(namespace, name).prefix)
            finally:
                await etcd.close()

        try:
            asyncio.run(clear(JobSpec.from_yaml(spec_yaml).etcd_endpoints))
        except (JobSpecError, Exception) as error:  # the objects are gone; the keys may stay
            logger.warning("could not clear the etcd keys of %s/%s: %s", namespace, name, error)

