"""Every pod paddlecloud renders passes the restricted Pod Security Standard (tests/k8s/restricted_profile.py),
except what a job or a component explicitly needs (named here, with the reason)."""

from __future__ import annotations

import copy
import re

import kubernetes_validate
import pytest
import restricted_profile as pss
import yaml
from rendered_objects import DEPLOY, DEPLOY_FILES, pod_spec, rendered

from paddlecloud.backends.k8s import manifests
from paddlecloud.paddlejob import translate

pytestmark = pytest.mark.unit

RENDERED = rendered()
# kinds of CRDs (ours, Kopf's, Volcano's, Kueue's): tests/k8s/test_kustomize.py checks them
THIRD_PARTY_KINDS = ("CustomResourceDefinition", "KopfPeering", "ClusterKopfPeering", "Queue",
                     "ResourceFlavor", "ClusterQueue", "LocalQueue")

# source -> the controls it may relax, and why (docs/kubernetes.md, "Pod security")
RELAXED = {
    # Kaniko unpacks image layers as their owners: root, with the file capabilities
    "image_build.build_job": {"runAsNonRoot", "runAsUser", "capabilities.add"},
}


def _pods():
    for source, docs in RENDERED.items():
        for doc in docs:
            pod = pod_spec(doc)
            if pod is not None:
                yield source, doc, pod


PODS = list(_pods())


def _runs_users_programs(doc) -> bool:
    role = (doc["metadata"].get("labels") or {}).get(manifests.ROLE_LABEL)
    return role in (manifests.TRAINER, manifests.PSERVER, manifests.HETER)


@pytest.mark.parametrize(("source", "doc", "pod"), PODS,
                         ids=[f"{s}:{d['kind']}/{d['metadata']['name']}" for s, d, _ in PODS])
def test_every_rendered_pod_passes_the_restricted_profile(source, doc, pod):
    """Users' programs run as their images' users (a root image writes into its WORKDIR)
    unless the job asks for the restricted profile: they alone may miss runAsNonRoot;
    paddlecloud's own containers beside them never do."""
    allowed = RELAXED.get(source, set())
    users = {c["name"] for c in pod["containers"]} if (
        _runs_users_programs(doc) and source != "dry-run restricted-ps") else set()
    found = [v for v in pss.violations(pod) if v.split(":")[0] not in allowed
             and not (v.startswith("runAsNonRoot: container ") and v.split()[2] in users)]
    assert not found, f"{source} {doc['kind']}/{doc['metadata']['name']}: {found}"


def test_the_restricted_profile_runs_every_container_as_the_uid_it_names():
    pods = [(doc, pod_spec(doc)) for doc in RENDERED["dry-run restricted-ps"]
            if _runs_users_programs(doc) and pod_spec(doc) is not None]
    assert len(pods) == 2
    for doc, pod in pods:
        assert pod["securityContext"]["runAsUser"] == 2000
        assert pod["securityContext"]["fsGroup"] == 2000
        assert pss.violations(pod) == [], doc["metadata"]["name"]


def test_the_sources_cover_every_kind_of_pod():
    names = {d["metadata"]["name"] for _, d, _ in PODS}
    containers = {c["name"] for _, _, pod in PODS for c in pss.containers(pod)}
    assert {"tiny-master", "tiny-trainer", "ctr-ps", "paddlecloud-etcd", "paddlecloud-operator",
            "paddlecloud-job-server"} <= names
    assert {"wait-master", "wait-pservers", "paddlecloud-agent", "kaniko"} <= containers
    assert any(d["kind"] == "StatefulSet" and d["metadata"]["name"].endswith("-heter") for _, d, _ in PODS)


def test_the_checker_fails_on_every_missing_or_unsafe_field():
    pod = copy.deepcopy(pod_spec(next(d for d in RENDERED["dry-run restricted-ps"]
                                      if d["kind"] == "Job")))
    assert pss.violations(pod) == []
    cases = {
        "runAsNonRoot": lambda p: p["securityContext"].pop("runAsNonRoot"),
        "seccompProfile": lambda p: p["securityContext"].pop("seccompProfile"),
        "allowPrivilegeEscalation": lambda p: p["containers"][0]["securityContext"].pop(
            "allowPrivilegeEscalation"),
        "capabilities.drop ALL": lambda p: p["containers"][0]["securityContext"].pop("capabilities"),
        "privileged": lambda p: p["containers"][0]["securityContext"].update(privileged=True),
        "hostNetwork": lambda p: p.update(hostNetwork=True),
        "hostPID": lambda p: p.update(hostPID=True),
        "hostPath": lambda p: p["volumes"].append({"name": "root", "hostPath": {"path": "/"}}),
        "runAsUser": lambda p: p["securityContext"].update(runAsUser=0),
        "capabilities.add": lambda p: p["containers"][0]["securityContext"]["capabilities"].update(
            add=["SYS_ADMIN"]),
        "hostPort": lambda p: p["containers"][0]["ports"].append({"containerPort": 1, "hostPort": 1}),
    }
    for control, breaks in cases.items():
        broken = copy.deepcopy(pod)
        breaks(broken)
        assert any(v.startswith(control + ":") for v in pss.violations(broken)), control


def test_trainers_and_pservers_get_no_api_token_and_the_master_has_probes():
    for _source, doc, pod in PODS:
        role = (doc["metadata"].get("labels") or {}).get(manifests.ROLE_LABEL)
        if role in (manifests.TRAINER, manifests.PSERVER, manifests.HETER):
            assert pod["automountServiceAccountToken"] is False, doc["metadata"]["name"]
            assert "serviceAccountName" not in pod, doc["metadata"]["name"]
        if role == manifests.MASTER and doc["kind"] == "Deployment":
            master = pod["containers"][0]
            assert master["readinessProbe"] and master["livenessProbe"]


def test_only_masters_and_pservers_get_etcd_credentials():
    docs = RENDERED["dry-run ps-everything"]  # https:// etcd endpoints
    for doc in docs:
        pod = pod_spec(doc)
        if pod is None:
            continue
        role = doc["metadata"]["labels"][manifests.ROLE_LABEL]
        env = {e["name"] for c in pss.containers(pod) for e in c.get("env") or []}
        mounted = {v["name"] for v in pod.get("volumes") or []}
        etcd = {"PADDLE_ETCD_CA_FILE", "PADDLE_ETCD_CERT_FILE", "PADDLE_ETCD_KEY_FILE",
                "PADDLE_ETCD_USER", "PADDLE_ETCD_PASSWORD_FILE"}
        assert "PADDLE_ETCD_PASSWORD" not in env, doc["metadata"]["name"]  # a file, never a value
        if role in (manifests.MASTER, manifests.PSERVER):
            assert etcd <= env and {"etcd-tls", "etcd-user"} <= mounted, doc["metadata"]["name"]
        else:
            assert not etcd & env and not {"etcd-tls", "etcd-user"} & mounted, doc["metadata"]["name"]


# Kinds newer than the oldest Kubernetes the install supports (1.28), from the release that
# has them: deploy/served-namespace.yaml's admission policy is GA in 1.30 (docs/kubernetes.md
# says a 1.28 cluster installs the rest without it).
KIND_SINCE = {"ValidatingAdmissionPolicy": "1.30", "ValidatingAdmissionPolicyBinding": "1.30"}


@pytest.mark.parametrize("path", DEPLOY_FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_deploy_file_is_strictly_valid(path):
    for doc in RENDERED[f"deploy/{path.relative_to(DEPLOY)}"]:
        if doc["kind"] in THIRD_PARTY_KINDS:  # no built-in schema
            continue
        for version in (KIND_SINCE.get(doc["kind"], "1.28"), kubernetes_validate.latest_version()):
            kubernetes_validate.validate(doc, version, strict=True)


def test_host_intranet_relaxes_only_the_node_network(tmp_path):
    doc = yaml.safe_load((DEPLOY / "examples" / "ctr-wide-deep-ps.yaml").read_text())
    doc["spec"]["intranet"] = "Host"
    doc["spec"]["securityProfile"] = "restricted"
    spec = translate(doc).validate()
    for obj in manifests.master_objects(spec, None):
        pod = pod_spec(obj)
        if pod is not None:
            found = {v.split(":")[0] for v in pss.violations(pod)}
            assert found == {"hostNetwork", "hostPort"}, (obj["metadata"]["name"], found)


def test_the_image_runs_as_a_numeric_non_root_user_matching_the_pods():
    users = re.findall(r"^USER\s+(\S+)", (DEPLOY / "Dockerfile").read_text(), re.MULTILINE)
    assert users, "deploy/Dockerfile sets no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0
    assert int(uid) == manifests.RUN_AS_USER
