"""Every manifest paddlecloud renders or ships, checked against the official schemas.

`kubernetes-validate` holds the OpenAPI schemas of each Kubernetes release offline;
strict mode refuses unknown fields. The Volcano PodGroup has no official schema and
is checked against the fields Volcano defines. Also here: the job spec's checks and
the environment invariants of docs/design.md section 8.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from rendered_objects import dry_run, example_submit_args

from paddlecloud.backends.k8s import manifests
from paddlecloud.jobspec import DataVolume, JobSpec, JobSpecError
from paddlecloud.paddlejob import translate

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
EXAMPLES = sorted((DEPLOY / "examples").glob("*.yaml"))
VERSIONS = ("1.28", kubernetes_validate.latest_version())
QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")

# scheduling.volcano.sh/v1beta1 PodGroupSpec, as Volcano's API package defines it
PODGROUP_SPEC = {"minMember": int, "minTaskMember": dict, "queue": str,
                 "priorityClassName": str, "minResources": dict, "networkTopology": dict}

FLAG_SETS = {
    "collective-minimal": ["tiny", "--module", "tiny.train"],
    "ps-everything": ["ctr", "--module", "ctr.train", "--trainers", "4", "--pservers", "2",
                      "--trainer-cpu", "4", "--trainer-memory", "8Gi", "--pserver-cpu", "500m",
                      "--pserver-memory", "3Gi", "--input", "/data/a/*.csv", "--input",
                      "s3://bucket/b/*.csv", "--output", "/data/model", "-e", "A=1", "-e",
                      "PYTHONPATH=/extra", "--data-volume", "ctr-data:/data", "--epochs", "5",
                      "--namespace", "team-b", "--etcd-endpoints",
                      "http://etcd-0:2379,http://etcd-1:2379", "--image", "reg.io/pc:1",
                      "--clean-pod-policy", "Never"],
    "gpu-collective": ["resnet", "--module", "resnet.train", "--trainers", "8", "--trainer-gpu",
                       "8", "--trainer-memory", "120Gi"],
}


def check_podgroup(doc: dict[str, Any]) -> None:
    """A PodGroup as Volcano defines it (there is no official OpenAPI schema to use)."""
    assert set(doc) <= {"apiVersion", "kind", "metadata", "spec"}, set(doc)
    assert doc["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert doc["kind"] == "PodGroup"
    for version in VERSIONS:  # its metadata is an ObjectMeta like any other object's
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "ConfigMap",
                                      "metadata": doc["metadata"]}, version, strict=True)
    spec = doc["spec"]
    unknown = set(spec) - set(PODGROUP_SPEC)
    assert not unknown, f"PodGroup spec fields Volcano does not define: {unknown}"
    for key, kind in PODGROUP_SPEC.items():
        if key in spec:
            assert isinstance(spec[key], kind), (key, spec[key])
    assert 1 <= spec["minMember"] < 2**31
    for name, quantity in (spec.get("minResources") or {}).items():
        assert isinstance(name, str) and QUANTITY.fullmatch(str(quantity)), (name, quantity)


def check(doc: dict[str, Any]) -> None:
    if doc.get("kind") == "PodGroup":
        check_podgroup(doc)
        return
    for version in VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


# ---- schemas ------------------------------------------------------------------------------
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_renders_valid_manifests(example):
    text = dry_run(example_submit_args(example))
    assert text == dry_run(example_submit_args(example))  # stable
    docs = list(yaml.safe_load_all(text))
    assert {d["kind"] for d in docs} >= {"ConfigMap", "Deployment", "Service", "Job"}
    for doc in docs:
        check(doc)


@pytest.mark.parametrize("flags", FLAG_SETS.values(), ids=FLAG_SETS.keys())
def test_representative_flag_sets_render_valid_manifests(flags):
    docs = list(yaml.safe_load_all(dry_run(flags)))
    for doc in docs:
        check(doc)


def test_objects_with_owner_references_are_valid_too():
    spec = JobSpec(name="owned", module="m.train", trainers=2, pservers=1, with_gloo=2,
                   scheduler_name="volcano", queue="q", min_resources={"cpu": "10"})
    owner = manifests.owner_reference("owned", "6a1b2c3d-0000-4000-8000-000000000000")
    docs = [*manifests.master_objects(spec, owner), manifests.master_service(spec, owner),
            manifests.podgroup(spec, owner, min_member=1)]
    for doc in docs:
        check(doc)
        assert doc["metadata"]["ownerReferences"] == [owner]


def test_strict_validation_catches_a_misspelt_field():
    deployment = manifests.master_deployment(JobSpec(name="typo", module="m"))
    deployment["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[0], strict=True)
    group = manifests.podgroup(JobSpec(name="typo", module="m", scheduler_name="volcano"), None)
    group["spec"]["minMembers"] = 3
    with pytest.raises(AssertionError, match="minMembers"):
        check_podgroup(group)


@pytest.mark.parametrize("path", [DEPLOY / "rbac.yaml", DEPLOY / "etcd.yaml", *EXAMPLES],
                         ids=lambda p: str(p.relative_to(DEPLOY)))
def test_the_static_yaml_in_deploy_is_valid(path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs
    for doc in docs:
        if doc["kind"] == "PaddleJob":  # no official schema: paddlecloud's own reading checks it
            translate(doc).validate()
        else:
            check(doc)


def test_rbac_yaml_is_what_the_code_renders_and_namespace_scoped():
    shipped = [d for d in yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()) if d]
    assert shipped == manifests.rbac("default")
    assert [d["kind"] for d in shipped] == ["Role"]  # no ClusterRole(Binding)
    assert not any("*" in r["verbs"] or "*" in r["resources"] for r in shipped[0]["rules"])


RBAC_SPECS = {
    "ps-service-elastic": JobSpec(name="ctr", namespace="ml", module="m", trainers=2, pservers=2,
                                  max_trainers=5, intranet="Service", with_gloo=1),
    "volcano-heter": JobSpec(name="ht", namespace="ml", module="m", trainers=2, pservers=1, heters=2,
                             scheduler_name="volcano", podgroup_name="ht-gang"),
    "collective": JobSpec(name="col", namespace="ml", module="m", trainers=4),
}


@pytest.mark.parametrize("spec", RBAC_SPECS.values(), ids=RBAC_SPECS.keys())
def test_the_masters_role_names_only_its_own_jobs_objects(spec):
    sa, role, binding = manifests.master_rbac(spec, manifests.owner_reference(spec.name, "u-1"))
    for doc in (sa, role, binding):
        check(doc)
        assert doc["metadata"]["ownerReferences"][0]["uid"] == "u-1"
        assert doc["metadata"]["name"] == f"{spec.name}-master"
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": spec.namespace}]
    pod = manifests.master_deployment(spec)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    # every object the job may ever have: rendered at its most trainers, and the
    # workloads and headless Services of roles it lacks (the clean-up deletes them by name)
    most = spec.replace(trainers=max(spec.trainers, spec.trainer_range.maximum))
    own = {o["metadata"]["name"] for o in [*manifests.submit_objects(spec),
                                           *manifests.master_objects(most, None)]}
    own |= {manifests.role_name(spec.name, r) for r in (manifests.PSERVER, manifests.HETER)}
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        if set(rule["verbs"]) & {"get", "update", "patch", "delete"}:
            assert rule.get("resourceNames"), rule  # empty would mean: every name
            assert set(rule["resourceNames"]) <= own, set(rule["resourceNames"]) - own
        else:  # the API cannot scope these by name
            assert set(rule["verbs"]) <= {"create", "list", "watch"} and "resourceNames" not in rule
    named = {n for r in role["rules"] for n in r.get("resourceNames", [])}
    assert f"{spec.name}-trainer" in named and f"{spec.name}-master" in named
    if spec.intranet == "Service":  # a resize up to max_trainers makes these Services
        assert {f"{spec.name}-trainer-{i}" for i in range(most.trainers)} <= named
    if spec.uses_volcano:
        assert manifests.podgroup_name(spec) in named


@pytest.mark.parametrize("path", ["rbac.yaml", "operator.yaml", "components/job-server/job-server.yaml"])
def test_who_creates_a_masters_role_holds_every_right_in_it(path):
    """The API server refuses a Role (or its binding) granting what its creator lacks."""
    role = next(d for d in yaml.safe_load_all((DEPLOY / path).read_text()) if d and d["kind"] == "Role")
    held = manifests.unscoped_rules(role["rules"])
    needed = manifests.unscoped_rules(manifests.master_rules(RBAC_SPECS["volcano-heter"]))
    for (group, resource), verbs in needed.items():
        assert set(verbs) <= set(held.get((group, resource), [])), (path, group, resource)
    for kind in ("serviceaccounts", "roles", "rolebindings"):
        assert any("create" in v for (_, r), v in held.items() if r == kind), (path, kind)


def test_etcd_has_three_members_with_volumes_and_a_client_service():
    docs = {(d["kind"], d["metadata"]["name"]): d
            for d in yaml.safe_load_all((DEPLOY / "etcd.yaml").read_text()) if d}
    sts = docs[("StatefulSet", "paddlecloud-etcd")]
    assert sts["spec"]["replicas"] == 3 and sts["spec"]["volumeClaimTemplates"]
    command = " ".join(sts["spec"]["template"]["spec"]["containers"][0]["command"])
    for i in range(3):
        assert f"paddlecloud-etcd-{i}=https://paddlecloud-etcd-{i}.paddlecloud-etcd-peers" in command
    assert docs[("Service", "paddlecloud-etcd-peers")]["spec"]["clusterIP"] == "None"
    # the client Service is what job specs use by default
    assert "https://paddlecloud-etcd:2379" == JobSpec(name="x", module="m").etcd_endpoints
    assert ("Service", "paddlecloud-etcd") in docs


# ---- the environment of docs/design.md section 8 -------------------------------------------------
def _expand(value: str, env: dict[str, str]) -> str:
    """What the kubelet does with `$(VAR)` references to earlier variables."""
    return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], value)


def _pod_env(template_env: list[dict[str, Any]], downward: dict[str, str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for entry in template_env:
        if "secretKeyRef" in entry.get("valueFrom", {}):
            continue  # a Secret's value: no part of the downward API
        if "valueFrom" in entry:
            env[entry["name"]] = downward[entry["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            env[entry["name"]] = _expand(entry["value"], env)
    return env


@pytest.mark.parametrize("intranet", ["PodIP", "Service", "HostNetwork"])
def test_each_pservers_own_endpoint_is_in_the_list_exactly_once(intranet):
    spec = JobSpec(name="ctr", namespace="ml", module="ctr.train", trainers=2, pservers=3,
                   intranet=intranet)
    sts = manifests.pserver_statefulset(spec, None)
    service = manifests.role_services(spec, manifests.PSERVER, owner=None)[0]
    assert sts["spec"]["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None"
    container = sts["spec"]["template"]["spec"]["containers"][0]
    for i in range(3):
        pod = f"ctr-ps-{i}"  # StatefulSet pod names: NAME-<ordinal>
        env = _pod_env(container["env"], {
            "metadata.name": pod, "status.podIP": f"10.1.0.{i}",
            f"metadata.labels['{manifests.POD_INDEX_LABEL}']": str(i)})
        own = f"{env['POD_IP']}:{env['PADDLE_PORT']}"
        assert env["PADDLE_PSERVERS_IP_PORT_LIST"].split(",").count(own) == 1
        assert env["PADDLE_PSERVERS_IP_PORT_LIST"].split(",").index(own) == int(env["PADDLE_PSERVER_ID"])
        assert env["TRAINING_ROLE"] == "PSERVER" and env["PADDLE_PSERVERS_NUM"] == "3"
        assert env["PADDLE_TRAINERS_NUM"] == "2"
    assert container["command"] == ["python3", "-m", "ctr.train"]  # never wrapped


def test_collective_trainers_find_themselves_in_the_trainer_endpoints():
    spec = JobSpec(name="rn", namespace="ml", module="rn.train", trainers=4)
    job_ = manifests.trainer_job(spec, None)
    service = manifests.role_services(spec, manifests.TRAINER, owner=None)[0]
    pod = job_["spec"]["template"]["spec"]
    assert pod["subdomain"] == service["metadata"]["name"] == "rn-trainer"
    assert job_["spec"]["completionMode"] == "Indexed"
    assert job_["spec"]["backoffLimit"] >= 10
    for i in range(4):
        env = _pod_env(pod["containers"][0]["env"], {
            "metadata.name": f"rn-trainer-{i}-xyz", "status.podIP": f"10.2.0.{i}",
            f"metadata.annotations['{manifests.COMPLETION_INDEX_ANNOTATION}']": str(i)})
        assert env["PADDLE_TRAINER_ID"] == str(i)
        endpoints = env["PADDLE_TRAINER_ENDPOINTS"].split(",")
        assert endpoints.count(env["PADDLE_CURRENT_ENDPOINT"]) == 1
        assert endpoints.index(env["PADDLE_CURRENT_ENDPOINT"]) == i
        # an Indexed Job pod's hostname is JOB-<index>, under the Service of its subdomain
        assert env["PADDLE_CURRENT_ENDPOINT"].startswith(f"rn-trainer-{i}.rn-trainer.ml.svc:")
        assert "PADDLE_PSERVERS_IP_PORT_LIST" not in env
    assert pod["containers"][0]["command"] == ["python3", "-m", "rn.train"]


def test_gpu_trainers_get_gpus_and_a_memory_backed_dev_shm():
    spec = JobSpec(name="rn", module="rn.train", trainers=2, trainer_gpu=8)
    pod = manifests.trainer_job(spec, None)["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    cpu_pod = manifests.trainer_job(JobSpec(name="cpu", module="m"), None)["spec"]["template"]["spec"]
    assert not any(v["name"] == "dshm" for v in cpu_pod["volumes"])


def test_gloo_settings_point_at_one_rendezvous_store():
    spec = JobSpec(name="g", namespace="ml", module="m", trainers=2, pservers=2, with_gloo=1)
    trainer = {e["name"]: e.get("value") for e in
               manifests.trainer_job(spec, None)["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert trainer["PADDLE_WITH_GLOO"] == "1" and trainer["PADDLE_GLOO_RENDEZVOUS"] == "3"
    assert trainer["PADDLE_GLOO_HTTP_ENDPOINT"] == "g-ps-0.g-ps.ml.svc:36001"
    pserver = {e["name"] for e in
               manifests.pserver_statefulset(spec, None)["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "PADDLE_WITH_GLOO" not in pserver  # withGloo 1: trainers only; 2: pservers too


def test_package_files_are_mounted_and_on_the_python_path():
    spec = JobSpec(name="p", module="ctr.train", package_path="/src", package_files=("ctr/train.py",),
                   env=(("PYTHONPATH", "/extra"),))
    pod = manifests.trainer_job(spec, None)["spec"]["template"]["spec"]
    assert pod["volumes"][0]["configMap"] == {"name": "p-package", "items": [
        {"key": "ctr__train.py", "path": "ctr/train.py"}]}
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["PYTHONPATH"] == "/opt/paddlecloud/package:/extra"
    configmap = manifests.package_configmap(spec, {"ctr/train.py": b"x = 1\n", "m.bin": b"\xff\x00"})
    assert configmap["data"] == {"ctr__train.py": "x = 1\n"}
    assert configmap["binaryData"] == {"m.bin": "/wA="}


def test_the_master_runs_two_replicas_with_leader_readiness_and_a_read_only_data_volume():
    spec = JobSpec(name="m", module="x", inputs=("/data/*.csv",),
                   data_volume=DataVolume("claim", "/data"))
    deployment = manifests.master_deployment(spec)
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 2
    # ready = the leader serving: /ready on the HTTP port (the kubelet's gRPC probe speaks no TLS)
    assert pod["containers"][0]["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "metrics"}
    assert "tcpSocket" in pod["containers"][0]["livenessProbe"]  # a standby must live
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "claim", "readOnly": True}} in pod["volumes"]
    service = manifests.master_service(spec, None)
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"].get("publishNotReadyAddresses") is not True  # ready = the leader only


def test_common_labels_are_on_everything():
    spec = JobSpec(name="lab", module="m", trainers=2, pservers=1, scheduler_name="volcano")
    for doc in [*manifests.submit_objects(spec), *manifests.master_objects(spec, None)]:
        labels = doc["metadata"]["labels"]
        assert labels[manifests.APP_LABEL] == "paddlecloud" and labels[manifests.JOB_LABEL] == "lab"
        assert labels[manifests.ROLE_LABEL] in ("master", "pserver", "trainer")


# ---- the job spec -------------------------------------------------------------------------------
def test_job_spec_survives_yaml():
    spec = translate(yaml.safe_load((DEPLOY / "examples/resnet-collective-gpu.yaml").read_text()),
                                  inputs=("/data/x",), env=(("A", "1"),),
                                  data_volume=DataVolume("c", "/data"))
    assert JobSpec.from_yaml(spec.to_yaml()) == spec
    assert spec.intranet == "PodIP" and spec.uses_volcano and spec.queue == "default"


@pytest.mark.parametrize("changes, words", [
    ({"name": "Bad_Name"}, ["'Bad_Name'", "DNS-1035"]),
    ({"name": "a" * 41}, ["at most 40"]),
    ({"name": "1abc"}, ["'1abc'"]),
    ({"trainers": 0}, ["trainers 0", ">= 1"]),
    ({"pservers": -1}, ["pservers -1", ">= 0"]),
    ({"epochs": 0}, ["epochs 0"]),
    ({"trainer_memory": "8GB"}, ["'8GB'", "'4Gi'"]),
    ({"env": (("POD_IP", "1.2.3.4"),)}, ["POD_IP", "set by paddlecloud"]),
    ({"env": (("1X", "y"),)}, ["'1X'"]),
    ({"inputs": ("data/*.csv",)}, ["'data/*.csv'", "absolute path"]),
    ({"clean_pod_policy": "Sometimes"}, ["'Sometimes'", "OnCompletion"]),
    ({"intranet": "Carrier-Pigeon"}, ["'Carrier-Pigeon'", "PodIP"]),
    ({"with_gloo": 3}, ["withGloo 3"]),
    ({"etcd_endpoints": "ftp://etcd:2379"}, ["'ftp://etcd:2379'"]),
    ({"module": ""}, ["--module"]),
    ({"queue": "q"}, ["Volcano"]),
])
def test_a_bad_spec_is_refused_naming_the_value(changes, words):
    values: dict[str, Any] = {"name": "ok", "module": "ctr.train", **changes}
    with pytest.raises(JobSpecError) as caught:
        JobSpec(**values).validate()
    for word in words:
        assert word in str(caught.value)


def test_data_volume_is_claim_colon_path():
    assert DataVolume.parse("ctr-data:/data") == DataVolume("ctr-data", "/data")
    with pytest.raises(JobSpecError, match="'nopath'.*CLAIM:PATH"):
        DataVolume.parse("nopath")
    with pytest.raises(JobSpecError, match="'relative'.*absolute"):
        DataVolume.parse("claim:relative")


def _paddlejob(**spec: Any) -> dict[str, Any]:
    worker = {"replicas": 2, "template": {"spec": {"containers": [
        {"name": "paddle", "image": "img", "command": ["python", "train.py"]}]}}}
    return {"apiVersion": "batch.paddlepaddle.org/v1", "kind": "PaddleJob",
            "metadata": {"name": "pj"}, "spec": {"worker": worker, **spec}}


@pytest.mark.parametrize("doc, words", [
    ({**_paddlejob(), "apiVersion": "batch.paddlepaddle.org/v1alpha1"},
     ["'batch.paddlepaddle.org/v1alpha1'", "use batch.paddlepaddle.org/v1"]),
    ({**_paddlejob(), "kind": "PyTorchJob"}, ["'PyTorchJob'", "PaddleJob"]),
    (_paddlejob(heter={"replicas": 1, "template": {"spec": {"containers": [
        {"name": "heter", "image": "img"}]}}}), ["spec.heter", "needs spec.ps"]),
    (_paddlejob(intranet="Overlay"), ["'Overlay'", "PodIP, Service or Host"]),
    (_paddlejob(elastic=-1), ["spec.elastic", "-1"]),
    (_paddlejob(sampleSetRef={"name": "s"}), ["spec.sampleSetRef", "--data-volume"]),
    (_paddlejob(surprise=True), ["spec.surprise"]),
    (_paddlejob(cleanPolicy="Never"), ["spec.cleanPolicy", "did you mean spec.cleanPodPolicy?"]),
    (_paddlejob(schedulingPolicy={"minAvailable": 1}), ["minAvailable", "Volcano"]),
])
def test_a_paddlejob_with_what_paddlecloud_cannot_run_is_refused_by_name(doc, words):
    with pytest.raises(JobSpecError) as caught:
        translate(doc).validate()
    for word in words:
        assert word in str(caught.value)


def test_paddlejob_host_intranet_and_templates():
    spec = translate(_paddlejob(intranet="Host", cleanPodPolicy="Never"),
                                  namespace="ml").validate()
    assert (spec.intranet, spec.clean_pod_policy, spec.namespace, spec.trainers) == (
        "HostNetwork", "Never", "ml", 2)
    pod = manifests.trainer_job(spec, None)["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert pod["containers"][0]["command"] == ["python", "train.py"]  # as written
    assert pod["containers"][0]["image"] == "img"  # the template's image is kept


def test_a_template_without_command_runs_its_entrypoint_and_our_env_is_refused():
    doc = _paddlejob()
    del doc["spec"]["worker"]["template"]["spec"]["containers"][0]["command"]
    spec = translate(doc)
    container = manifests.trainer_job(spec, None)["spec"]["template"]["spec"]["containers"][0]
    assert "command" not in container  # the image's entrypoint, unchanged
    with_module = manifests.trainer_job(spec.replace(module="x.train"), None)  # --module fills it in
    assert with_module["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "python3", "-m", "x.train"]
    doc = _paddlejob()
    doc["spec"]["worker"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "PADDLE_TRAINER_ID", "value": "0"}]
    with pytest.raises(JobSpecError, match="sets PADDLE_TRAINER_ID, which paddlecloud sets itself"):
        manifests.trainer_job(translate(doc), None)


def test_a_package_over_a_configmap_is_refused_with_the_way_out():
    spec = JobSpec(name="big", module="m", package_path="/src", package_files=("w.bin",))
    with pytest.raises(manifests.PackageTooLarge, match="bake the package into the image"):
        manifests.package_configmap(spec, {"w.bin": b"\xff" * (800 * 1024)})  # base64: 1.07 MB
    with pytest.raises(JobSpecError, match="'a b.py'"):
        manifests.package_key("a b.py")


def test_the_master_is_given_the_jobs_format_and_chunk_size():
    docs = list(yaml.safe_load_all(dry_run(["fmt", "--module", "m.train", "--input", "/data/*.bin",
                                            "--format", "file", "--chunk-bytes", "1MiB"])))
    master = next(d for d in docs if d["kind"] == "Deployment")
    command = master["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--format") + 1] == "file"
    assert command[command.index("--chunk-bytes") + 1] == str(2**20)
    defaults = list(yaml.safe_load_all(dry_run(["dflt", "--module", "m.train", "--input", "/d/*"])))
    command = next(d for d in defaults if d["kind"] == "Deployment")["spec"]["template"]["spec"][
        "containers"][0]["command"]
    assert "--chunk-bytes" not in command  # 0: the master's own default


def test_input_output_and_package_reach_every_role_through_the_environment():
    """docs/design.md section 8: a program that reads its own data finds where it is."""
    spec = JobSpec(name="own", module="demo.train", inputs=("/data/a.csv", "s3://b/*.csv"),
                   output="/out", pservers=1, package_path="/src", package_files=("demo/train.py",))
    for role_env in (manifests.trainer_env(spec), manifests._common_env(spec, "pserver")):
        env = {e["name"]: e.get("value") for e in role_env}
        assert env["PADDLECLOUD_INPUT"] == "/data/a.csv,s3://b/*.csv"
        assert env["PADDLECLOUD_OUTPUT"] == "/out"
        assert env["PADDLECLOUD_PACKAGE"] == manifests.PACKAGE_MOUNT
    with pytest.raises(JobSpecError, match="PADDLECLOUD_INPUT is set by paddlecloud itself"):
        JobSpec(name="own", module="m", env=(("PADDLECLOUD_INPUT", "/x"),)).validate()


def test_a_packages_requirements_without_an_image_build_are_refused_naming_them():
    """Seed 001's requirements.txt: nothing installs it for a package shipped in a ConfigMap."""
    spec = JobSpec(name="quickstart", module="m", package_path="/src/quick_start",
                   package_files=("requirements.txt", "trainer.py"))
    files = {"requirements.txt": b"pillow\nprotobuf==3.1.0\n", "trainer.py": b""}
    with pytest.raises(JobSpecError, match=r"lists pillow, protobuf==3\.1\.0.*--image"):
        manifests.submit_objects(spec, files)
    files["requirements.txt"] = b"# nothing to install\n\n"
    assert manifests.package_configmap(spec, files)["kind"] == "ConfigMap"


def test_trainers_are_told_the_grace_they_have_to_drain_to_a_checkpoint():
    pod = manifests.trainer_job(JobSpec(name="g", namespace="ml", module="m"), None)["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert pod["terminationGracePeriodSeconds"] == 30 and env["PADDLECLOUD_STOP_GRACE"] == "25"
    # a template's own grace is kept, and what the drain is told follows it
    template = {"spec": {"terminationGracePeriodSeconds": 120,
                         "containers": [{"name": "train", "image": "img", "command": ["python3", "t.py"]}]}}
    spec = JobSpec(name="g", namespace="ml", worker_template=template)
    pod = manifests.trainer_job(spec, None)["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert pod["terminationGracePeriodSeconds"] == 120 and env["PADDLECLOUD_STOP_GRACE"] == "115"
