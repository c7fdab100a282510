"""Everything paddlecloud renders for Kubernetes, gathered once for the hardening tests.

`job submit --dry-run` of representative flag sets and of every deploy/examples
PaddleJob, every file in deploy/, and the job server's Kaniko build Job. Each entry
names where it came from, so a failing check says which flag set or file to look at.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from paddlecloud.backends.k8s import image_build
from paddlecloud.cli.jobs import job

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
EXAMPLES = sorted((DEPLOY / "examples").glob("*.yaml"))
# every manifest in deploy/ (kustomize's own files apart), the optional components' included
DEPLOY_FILES = sorted(p for p in DEPLOY.rglob("*.yaml")
                      if p.name != "kustomization.yaml" and "examples" not in p.relative_to(DEPLOY).parts)

# one of each kind of pod paddlecloud renders: collective, PS with everything, GPU,
# the restricted profile, gloo, heter, Service and Host intranet
FLAG_SETS: dict[str, list[str]] = {
    "collective-minimal": ["tiny", "--module", "tiny.train"],
    "ps-everything": ["ctr", "--module", "ctr.train", "--trainers", "4", "--pservers", "2",
                      "--input", "/data/a/*.csv", "--output", "/data/model", "-e", "A=1",
                      "--data-volume", "ctr-data:/data", "--namespace", "team-b",
                      "--etcd-endpoints", "https://etcd-0:2379,https://etcd-1:2379"],
    "gpu-collective": ["resnet", "--module", "resnet.train", "--trainers", "8", "--trainer-gpu", "8"],
    "restricted-ps": ["locked", "--module", "m.train", "--pservers", "2", "--trainers", "2",
                      "--restricted", "--run-as-user", "2000"],
}


def dry_run(args: list[str]) -> str:
    result = CliRunner().invoke(job, ["submit", *args, "--dry-run"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def example_submit_args(path: Path) -> list[str]:
    """The `# submit: paddlecloud job submit ...` line each example documents."""
    line = next(line for line in path.read_text().splitlines() if line.startswith("# submit: "))
    args = shlex.split(line.removeprefix("# submit: "))
    assert args[:3] == ["paddlecloud", "job", "submit"], line
    return [str(REPO / a) if a.startswith("deploy/") else a for a in args[3:]]


def kaniko_job() -> dict[str, Any]:
    config = image_build.BuildConfig(registry="registry.example.com/pc", namespace="default",
                                     push_secret="push", context_claim="packages")
    return image_build.build_job(config, tag="0123456789abcdef", context="ctx/a.tar.gz")


def rendered() -> dict[str, list[dict[str, Any]]]:
    """source -> its Kubernetes objects (PaddleJobs and the CRD itself left out)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for name, flags in FLAG_SETS.items():
        out[f"dry-run {name}"] = [d for d in yaml.safe_load_all(dry_run(flags)) if d]
    for path in EXAMPLES:
        out[f"dry-run {path.name}"] = [d for d in yaml.safe_load_all(dry_run(example_submit_args(path))) if d]
    for path in DEPLOY_FILES:
        out[f"deploy/{path.relative_to(DEPLOY)}"] = [d for d in yaml.safe_load_all(path.read_text())
                                                     if d]
    out["image_build.build_job"] = [kaniko_job()]
    return out


def pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The pod spec of a workload (Deployment, StatefulSet, Job, Pod), else None."""
    if doc.get("kind") == "Pod":
        return doc["spec"]
    if doc.get("kind") in ("Deployment", "StatefulSet", "Job", "DaemonSet", "ReplicaSet"):
        return doc["spec"]["template"]["spec"]
    if doc.get("kind") == "CronJob":
        return doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return None
