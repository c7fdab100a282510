"""Runtime images without docker-in-docker: a Kaniko Job builds `FROM base + package`.

The job server stores a package's build context (a generated Dockerfile and the
package's files, as one tar.gz) where the builder can read it: on a claim mounted
into the build pod (`tar://` context) or in an object store Kaniko reads itself
(`s3://`, `gs://`, `az://`). The build Job runs Kaniko's executor — rootless in the
sense that matters here (no Docker daemon, no privileged pod, no host socket) —
which pushes to the configured registry with credentials from a
`kubernetes.io/dockerconfigjson` Secret. The tag is the content hash of the package
and the base image, so the same pair is built once: an existing build Job (running
or done) is reused, not started again, and the job server records each image built
(`job_server.packages.PackageStore.record_image`), so the pair is not built again
once the build Job is gone (`ttlSecondsAfterFinished`) or the server restarted.

A build may take at most `MAX_BUILD_TIMEOUT_S`: the Python API's submit waits for
the build (`paddlecloud.sdk.SUBMIT_TIMEOUT_S`, longer than that), so a build the
server still waits for never outlives the client's request.

What this does NOT guarantee: that the registry or the base image are reachable
from the cluster, nor that Kaniko's own user is non-root (its executor image runs
as root inside an unprivileged container, as Kaniko requires).
"""

from __future__ import annotations

import hashlib
import io
import logging
import tarfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from paddlecloud.backends.k8s import manifests
from paddlecloud.backends.k8s.jobs import JobCreateError, call

logger = logging.getLogger(__name__)

KANIKO_IMAGE = "gcr.io/kaniko-project/executor:v1.23.2"
PACKAGE_DIR = manifests.PACKAGE_MOUNT  # where the image holds the package, on PYTHONPATH
CONTEXT_MOUNT = "/context"
DOCKER_CONFIG_MOUNT = "/kaniko/.docker"
BUILD_LABEL = "paddlecloud.org/image-build"
LOG_TAIL_LINES = 40
# The longest `BuildConfig.timeout_s`: below the SDK's submit timeout (paddlecloud.sdk
# .SUBMIT_TIMEOUT_S, 3600 s), so a client never gives up on a submit the server goes on with.
MAX_BUILD_TIMEOUT_S = 3000.0


class ImageBuildError(JobCreateError):
    """The build failed or took too long; the message carries the builder's log tail."""


@dataclass(frozen=True)
class BuildConfig:
    """Where images go and how they are built (the job server's configuration)."""

    registry: str  # e.g. registry.example.com/paddlecloud: images are REGISTRY/runtime:TAG
    namespace: str  # where the build Jobs run
    push_secret: str = ""  # a kubernetes.io/dockerconfigjson Secret in `namespace`
    context_claim: str = ""  # a PVC holding the store, for tar:// contexts
    builder_image: str = KANIKO_IMAGE
    timeout_s: float = 1800.0  # at most MAX_BUILD_TIMEOUT_S
    poll_s: float = 2.0

    def __post_init__(self) -> None:
        for key, most in (("timeout_s", MAX_BUILD_TIMEOUT_S), ("poll_s", MAX_BUILD_TIMEOUT_S)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= most:
                raise ValueError(f"build {key} {value!r} must be a number of seconds above 0 and at "
                                 f"most {most:.0f} (the Python API's submit waits "
                                 f"{MAX_BUILD_TIMEOUT_S:.0f} s and more for a build)")


def image_tag(package_digest: str, base_image: str) -> str:
    """The tag of the runtime image of a package on a base image: the hash of both."""
    return hashlib.sha256(f"{package_digest}\n{base_image}".encode()).hexdigest()[:32]


def image_ref(config: BuildConfig, tag: str) -> str:
    return f"{config.registry.rstrip('/')}/runtime:{tag}"


def build_job_name(tag: str) -> str:
    return f"paddlecloud-build-{tag[:24]}"


def dockerfile(base_image: str, *, has_requirements: bool) -> str:
    """The Dockerfile of a runtime image: the package on PYTHONPATH, its requirements installed."""
    lines = [f"FROM {base_image}", f"COPY package/ {PACKAGE_DIR}/"]
    if has_requirements:
        lines.append(f"RUN python -m pip install --no-cache-dir -r {PACKAGE_DIR}/requirements.txt")
    lines.append(f"ENV PYTHONPATH={PACKAGE_DIR}${{PYTHONPATH:+:$PYTHONPATH}}")  # the base's stays
    return "\n".join(lines) + "\n"


def context_archive(files: Mapping[str, bytes], base_image: str) -> bytes:
    """The build context as tar.gz: the Dockerfile and `package/` (reproducible: fixed mtimes)."""
    out = io.BytesIO()
    docker = dockerfile(base_image, has_requirements="requirements.txt" in files).encode()
    with tarfile.open(fileobj=out, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, data in [("Dockerfile", docker),
                           *((f"package/{p}", files[p]) for p in sorted(files))]:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


# What Kaniko's executor needs as root: chown/chmod of unpacked files, RUN steps' users.
KANIKO_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID")


def build_job(config: BuildConfig, *, tag: str, context: str) -> dict[str, Any]:
    """The Kaniko Job building image `tag` from `context` (a path on the claim, or a URL)."""
    name = build_job_name(tag)
    labels = {manifests.APP_LABEL: manifests.APP_NAME, BUILD_LABEL: tag[:63]}
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if "://" in context:
        context_arg = context
    else:
        if not config.context_claim:
            raise JobCreateError("a build context on a path needs the server's context_claim "
                                 "(the PVC holding the package store)")
        volumes.append({"name": "context",
                        "persistentVolumeClaim": {"claimName": config.context_claim,
                                                  "readOnly": True}})
        mounts.append({"name": "context", "mountPath": CONTEXT_MOUNT, "readOnly": True})
        context_arg = f"tar://{CONTEXT_MOUNT}/{context.lstrip('/')}"
    if config.push_secret:
        volumes.append({"name": "push-credentials", "secret": {
            "secretName": config.push_secret,
            "items": [{"key": ".dockerconfigjson", "path": "config.json"}]}})
        mounts.append({"name": "push-credentials", "mountPath": DOCKER_CONFIG_MOUNT,
                       "readOnly": True})
    container: dict[str, Any] = {
        "name": "kaniko",
        "image": config.builder_image,
        "args": [f"--context={context_arg}", "--dockerfile=Dockerfile",
                 f"--destination={image_ref(config, tag)}", "--cache=true",
                 "--snapshot-mode=redo"],
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"},
                      "limits": {"memory": "4Gi"}},
        # Kaniko unpacks the base image's files as their owners, so it runs as root (the one
        # relaxation of the restricted profile, docs/kubernetes.md) with only the
        # capabilities that needs: file ownership and the users of RUN steps.
        "securityContext": {"allowPrivilegeEscalation": False, "privileged": False,
                            "runAsNonRoot": False, "runAsUser": 0,
                            "capabilities": {"drop": ["ALL"], "add": list(KANIKO_CAPABILITIES)}},
    }
    if mounts:
        container["volumeMounts"] = mounts
    pod: dict[str, Any] = {"restartPolicy": "Never", "containers": [container],
                           "automountServiceAccountToken": False,
                           "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}}
    if volumes:
        pod["volumes"] = volumes
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": config.namespace, "labels": labels},
        "spec": {"backoffLimit": 0, "ttlSecondsAfterFinished": 86400,
                 "template": {"metadata": {"labels": labels}, "spec": pod}},
    }


def _log_tail(api: Any, *, namespace: str, job_name: str) -> str:
    """The last lines of the build pod's log ('' when there is no pod or no log)."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    pods = call(core.list_namespaced_pod, namespace, label_selector=f"job-name={job_name}",
                verb="list", resource="pods", namespace=namespace)
    items = sorted(pods.items or [], key=lambda p: str(p.metadata.creation_timestamp or ""))
    if not items:
        return ""
    response = call(core.read_namespaced_pod_log, items[-1].metadata.name, namespace,
                    tail_lines=LOG_TAIL_LINES, _preload_content=False, verb="get",
                    resource="pods/log", namespace=namespace, name=items[-1].metadata.name,
                    tolerate=(400, 404))
    if response is None:
        return ""
    text = response.data.decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-LOG_TAIL_LINES:])


def run_build(api: Any, config: BuildConfig, *, tag: str, context: str,
              clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep) -> str:
    """Builds (or finds built) image `tag`; returns its reference, or raises `ImageBuildError`."""
    from kubernetes import client

    batch = client.BatchV1Api(api)
    body = build_job(config, tag=tag, context=context)
    name, ns = body["metadata"]["name"], config.namespace
    if call(batch.create_namespaced_job, ns, body, verb="create", resource="jobs", namespace=ns,
            name=name, tolerate=(409,)) is None:
        logger.info("build Job %s exists: reusing it", name)
    deadline = clock() + config.timeout_s
    while True:
        job = call(batch.read_namespaced_job, name, ns, verb="get", resource="jobs",
                   namespace=ns, name=name)
        status = job.status
        if status is not None and (status.succeeded or 0) >= 1:
            return image_ref(config, tag)
        if status is not None and (status.failed or 0) >= 1:
            tail = _log_tail(api, namespace=ns, job_name=name)
            raise ImageBuildError(
                f"image build {name} failed (the same package and base image reuse this build: "
                f"kubectl -n {ns} delete job {name} to build again); the builder's log ends:\n"
                f"{tail}", status=422)
        if clock() >= deadline:
            tail = _log_tail(api, namespace=ns, job_name=name)
            raise ImageBuildError(f"image build {name} did not finish in {config.timeout_s:.0f}s; "
                                  f"the builder's log ends:\n{tail}", status=504)
        sleep(config.poll_s)
