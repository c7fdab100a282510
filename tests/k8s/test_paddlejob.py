"""The PaddleJob: the CRD, the one translation into a JobSpec, and what it renders.

The CRD is checked as Kubernetes checks it (kubernetes-validate, strict, 1.28 and
the newest schema); every PaddleJob example in deploy/examples validates against
the CRD's own openAPIV3Schema (jsonschema, unknown fields refused as `kubectl
apply`'s strict field validation refuses them) and translates and renders into
strictly valid objects. Each paddle-operator field is pinned by what it renders.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner

from paddlecloud.backends.k8s import manifests
from paddlecloud.cli.jobs import job
from paddlecloud.jobspec import JobSpec, JobSpecError
from paddlecloud.paddlejob import SPEC_FIELDS, load_documents, translate, translate_documents
from pdj_operator import crd as crdlib

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "deploy" / "crd-paddlejob.yaml"
EXAMPLES = sorted((REPO / "deploy" / "examples").glob("*.yaml"))
PADDLEJOB_EXAMPLES = [p for p in EXAMPLES if "kind: PaddleJob" in p.read_text()]
VERSIONS = ("1.28", kubernetes_validate.latest_version())
SIDECAR_VERSIONS = ("1.29", kubernetes_validate.latest_version())  # native sidecars: 1.29+


def strict(schema: Any) -> Any:
    """The CRD schema as strict field validation applies it: unknown fields refused,
    except under x-kubernetes-preserve-unknown-fields."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if "properties" in out and not schema.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("additionalProperties", False)
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def crd_schema() -> dict[str, Any]:
    doc = yaml.safe_load(CRD_FILE.read_text())
    return strict(doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def check(doc: dict[str, Any], versions: tuple[str, ...] = VERSIONS) -> None:
    if doc["kind"] == "PodGroup":
        assert set(doc["spec"]) <= {"minMember", "queue", "priorityClassName", "minResources"}
        return
    for version in versions:
        kubernetes_validate.validate(doc, version, strict=True)


def paddlejob(**spec: Any) -> dict[str, Any]:
    worker = {"replicas": 2, "template": {"spec": {"containers": [
        {"name": "paddle", "image": "img", "command": ["python", "train.py"]}]}}}
    return {"apiVersion": "batch.paddlepaddle.org/v1", "kind": "PaddleJob",
            "metadata": {"name": "pj", "namespace": "ml"}, "spec": {"worker": worker, **spec}}


def role(replicas: int = 1, *, command: bool = True, **pod: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "paddle", "image": "img"}
    if command:
        container["command"] = ["python", "train.py"]
    return {"replicas": replicas, "template": {"spec": {"containers": [container], **pod}}}


def env_of(container: dict[str, Any]) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container["env"]}


# ---- the CRD ------------------------------------------------------------------------------
def test_the_crd_is_strictly_valid_and_generated_from_its_module():
    doc = yaml.safe_load(CRD_FILE.read_text())
    check(doc)
    assert CRD_FILE.read_text() == crdlib.render(), (
        "deploy/crd-paddlejob.yaml is stale: python -m pdj_operator.crd > deploy/crd-paddlejob.yaml")
    names = doc["spec"]["names"]
    assert (doc["metadata"]["name"], names["shortNames"]) == ("paddlejobs.batch.paddlepaddle.org", ["pdj"])
    version = doc["spec"]["versions"][0]
    assert version["name"] == "v1" and version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns == {"Status": ".status.phase", "Mode": ".status.mode", "PS": ".status.ps.summary",
                       "Workers": ".status.worker.summary", "Heter": ".status.heter.summary",
                       "Epoch": ".status.epoch", "Done%": ".status.percentDone",
                       "ETA": ".status.eta", "Goodput": ".status.goodput.productivePercent",
                       "Age": ".metadata.creationTimestamp"}


def test_the_crd_and_the_translation_know_the_same_spec_fields():
    schema = crd_schema()["properties"]["spec"]["properties"]
    # sampleSetRef is paddle-operator's and refused by name by the translation
    assert set(schema) == set(SPEC_FIELDS) - {"sampleSetRef"}


def _structural(schema: Any, where: str = "") -> None:
    """Kubernetes' structural schema rules that matter here: a type everywhere, no $ref."""
    if not isinstance(schema, dict):
        return
    assert "$ref" not in schema, where
    if "properties" in schema or "items" in schema:
        assert schema.get("type") in ("object", "array"), where
    if not schema.get("x-kubernetes-int-or-string"):
        assert "type" in schema or where.endswith("metadata"), where
    for key, value in (schema.get("properties") or {}).items():
        _structural(value, f"{where}.{key}")
    if "items" in schema:
        _structural(schema["items"], f"{where}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        _structural(schema["additionalProperties"], f"{where}{{}}")


def test_the_crd_schema_is_structural():
    doc = yaml.safe_load(CRD_FILE.read_text())
    _structural(doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


@pytest.mark.parametrize("example", PADDLEJOB_EXAMPLES, ids=lambda p: p.name)
def test_every_paddlejob_example_fits_the_crd_and_renders_valid_objects(example):
    docs = load_documents(example.read_text(), source=str(example))
    schema = crd_schema()
    for doc in docs:
        if doc["kind"] == "PaddleJob":
            jsonschema.validate(doc, schema)
    spec = translate_documents(docs, source=str(example)).validate()
    owner = manifests.owner_reference(spec.name, "6a1b2c3d-0000-4000-8000-000000000000")
    rendered = [*manifests.submit_objects(spec), *manifests.master_objects(spec, owner)]
    agentless = any("initContainers" in (d.get("spec", {}).get("template", {}).get("spec") or {})
                    for d in rendered)
    for doc in rendered:
        check(doc, SIDECAR_VERSIONS if agentless else VERSIONS)


@pytest.mark.parametrize("change, path", [
    ({"cleanPolicy": "Never"}, "cleanPolicy"),
    ({"intranet": "Overlay"}, "intranet"),
    ({"withGloo": 3}, "withGloo"),
    ({"worker": {"replicas": 0, "template": {"spec": {"containers": [{"name": "p"}]}}}}, "replicas"),
    ({"worker": {"replicas": 1, "template": {"spec": {"containers": []}}}}, "containers"),
    ({"chunkBytes": "lots"}, "chunkBytes"),
])
def test_the_crd_schema_refuses_what_the_translation_refuses(change, path):
    doc = paddlejob(**change)
    with pytest.raises(jsonschema.ValidationError) as caught:
        jsonschema.validate(doc, crd_schema())
    assert path in str(caught.value.path) + str(caught.value.message) + str(caught.value.schema_path)
    with pytest.raises(JobSpecError):
        translate(doc).validate()


def test_pod_templates_keep_any_podtemplatespec_field_through_the_schema():
    doc = paddlejob(worker=role(2, nodeSelector={"a": "b"}, priorityClassName="p"))
    jsonschema.validate(doc, crd_schema())


# ---- the translation ----------------------------------------------------------------------
@pytest.mark.parametrize("doc, words", [
    (paddlejob(cleanPolicy="Never"), ["unknown field spec.cleanPolicy", "did you mean spec.cleanPodPolicy?"]),
    (paddlejob(worker={**role(), "replica": 2}), ["spec.worker.replica", "spec.worker.replicas"]),
    (paddlejob(schedulingPolicy={"queu": "q"}), ["spec.schedulingPolicy.queu", "queue"]),
    (paddlejob(zzz=1), ["spec.zzz", "known fields: cleanPodPolicy"]),
    ({**paddlejob(), "spek": {}}, ["PaddleJob.spek", "spec"]),
    (paddlejob(ps={**role(2), "limits": 3}), ["spec.ps.requests/limits", "fixed"]),
    (paddlejob(worker={**role(2), "requests": 3}), ["requests 3 <= replicas 2"]),
    (paddlejob(input="/data/x.csv"), ["spec.input", "list"]),
    (paddlejob(chunkBytes="lots"), ["spec.chunkBytes", "'lots'"]),
    (paddlejob(worker=role(1, command=False) | {"template": {"spec": {"containers": [{}]}}}),
     ["containers[0] needs a name"]),
])
def test_a_bad_paddlejob_is_refused_naming_the_field(doc, words):
    with pytest.raises(JobSpecError) as caught:
        translate(doc).validate()
    for word in words:
        assert word in str(caught.value)


def test_paddlecloud_fields_and_the_trainer_range_are_stored():
    spec = translate(paddlejob(
        elastic=1, worker={**role(2), "requests": 1, "limits": 4}, input=["/d/*.csv"], epochs=3,
        output="/d/model", format="file", chunkBytes="32MiB",
        dataVolume={"claim": "data", "mountPath": "/d"})).validate()
    assert (spec.trainer_range.minimum, spec.trainer_range.maximum) == (1, 4) and spec.trainers == 2 and spec.elastic == 1
    assert (spec.inputs, spec.epochs, spec.output) == (("/d/*.csv",), 3, "/d/model")
    assert (spec.data_format, spec.chunk_bytes) == ("file", 32 * 1024 * 1024)
    assert (spec.data_volume.claim, spec.data_volume.mount_path) == ("data", "/d")
    assert JobSpec.from_yaml(spec.to_yaml()) == spec  # the master reads back what was stored


def test_a_file_holds_one_paddlejob_and_at_most_one_podgroup():
    group = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
             "metadata": {"name": "g", "namespace": "ml"}, "spec": {"minMember": 2}}
    with pytest.raises(JobSpecError, match="holds 2 PaddleJob documents"):
        translate_documents([paddlejob(), paddlejob()])
    with pytest.raises(JobSpecError, match="'Service' document"):
        translate_documents([paddlejob(), {"kind": "Service"}])
    with pytest.raises(JobSpecError, match="schedulerName: volcano"):  # nobody uses Volcano
        translate_documents([paddlejob(), group]).validate()


def test_a_podgroup_document_is_applied_and_its_min_member_checked():
    doc = paddlejob(ps=role(1), worker=role(3, schedulerName="volcano"))
    group = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
             "metadata": {"name": "gang", "namespace": "ml"},
             "spec": {"minMember": 3, "queue": "research", "priorityClassName": "high"}}
    spec = translate_documents([doc, group]).validate()
    rendered = manifests.master_objects(spec, None)
    assert rendered[0]["kind"] == "PodGroup" and rendered[0]["metadata"]["name"] == "gang"
    assert rendered[0]["spec"] == {"minMember": 3, "queue": "research", "priorityClassName": "high"}
    by_kind = {d["kind"]: d for d in rendered}
    worker = by_kind["Job"]["spec"]["template"]
    ps = by_kind["StatefulSet"]["spec"]["template"]
    # schedulerName on the workers only, as paddle-operator's Example 4: every pod joins the gang
    for pod in (worker, ps):
        assert pod["spec"]["schedulerName"] == "volcano"
        assert pod["metadata"]["annotations"][manifests.PODGROUP_ANNOTATION] == "gang"
    # the pservers start first: the group's first minMember is theirs
    assert manifests.gang_size(spec, (manifests.PSERVER, manifests.HETER)) == 1
    too_big = copy.deepcopy(group)
    too_big["spec"]["minMember"] = 5
    with pytest.raises(JobSpecError) as caught:
        translate_documents([doc, too_big]).validate()
    assert ("minMember 5 is more than the 4 pods scheduled by Volcano (1 pserver, 3 trainer)"
            in str(caught.value))
    elsewhere = paddlejob(ps=role(1, schedulerName="kube-batch"), worker=role(3, schedulerName="volcano"))
    with pytest.raises(JobSpecError, match=r"pserver \(kube-batch\) pods name another scheduler"):
        translate_documents([elsewhere, group]).validate()
    disagree = paddlejob(ps=role(1), worker=role(3, schedulerName="volcano"),
                         schedulingPolicy={"queue": "other"})
    with pytest.raises(JobSpecError, match="disagree on queue"):
        translate_documents([disagree, group])


def test_a_user_min_member_caps_each_stage_of_the_gang():
    spec = translate(paddlejob(ps=role(2, schedulerName="volcano"),
                               worker=role(4, schedulerName="volcano"),
                               schedulingPolicy={"minAvailable": 3})).validate()
    assert manifests.podgroup(spec, None, min_member=2)["spec"]["minMember"] == 2  # pservers first
    assert manifests.podgroup(spec, None, min_member=6)["spec"]["minMember"] == 3


@pytest.mark.parametrize("gloo, roles", [(0, set()), (1, {"trainer"}), (2, {"trainer", "pserver"})])
def test_with_gloo_gives_the_rendezvous_to_the_roles_paddle_operator_gives_it(gloo, roles):
    spec = translate(paddlejob(ps=role(2), withGloo=gloo)).validate()
    containers = {
        "trainer": manifests.trainer_job(spec, None)["spec"]["template"]["spec"]["containers"][0],
        "pserver": manifests.pserver_statefulset(spec, None)["spec"]["template"]["spec"]["containers"][0],
    }
    for name, container in containers.items():
        env = env_of(container)
        if name in roles:
            assert env["PADDLE_WITH_GLOO"] == str(gloo) and env["PADDLE_GLOO_RENDEZVOUS"] == "3"
            assert env["PADDLE_GLOO_HTTP_ENDPOINT"] == "pj-ps-0.pj-ps.ml.svc:36001"
        else:
            assert "PADDLE_WITH_GLOO" not in env


def test_intranet_service_gives_each_pod_its_own_service():
    spec = translate(paddlejob(ps=role(2), intranet="Service", withGloo=1)).validate()
    objects = manifests.master_objects(spec, None)
    services = {d["metadata"]["name"]: d for d in objects if d["kind"] == "Service"}
    assert {"pj-ps", "pj-ps-0", "pj-ps-1", "pj-trainer", "pj-trainer-0", "pj-trainer-1"} <= set(services)
    assert services["pj-ps-1"]["spec"]["selector"][manifests.POD_NAME_LABEL] == "pj-ps-1"
    assert services["pj-trainer-0"]["spec"]["selector"][manifests.COMPLETION_INDEX_LABEL] == "0"
    sts = next(d for d in objects if d["kind"] == "StatefulSet")
    env = env_of(sts["spec"]["template"]["spec"]["containers"][0])
    assert env["PADDLE_PSERVERS_IP_PORT_LIST"] == "pj-ps-0.ml.svc:36000,pj-ps-1.ml.svc:36000"
    assert env["POD_IP"] == "$(POD_NAME).ml.svc"  # pj-ps-<i>.ml.svc: once in the list
    for doc in objects:
        check(doc)


def test_intranet_host_declares_host_ports_chosen_per_job():
    a = translate(paddlejob(ps=role(2), intranet="Host", withGloo=2)).validate()
    b = a.replace(name="other")
    port = manifests.paddle_port(a)
    assert 30000 <= port < 32000 and port == manifests.paddle_port(a)  # stable
    assert manifests.paddle_port(b) != port  # another job, another pair (these two names)
    pod = manifests.pserver_statefulset(a, None)["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert {"name": "paddle", "containerPort": port, "hostPort": port} in pod["containers"][0]["ports"]
    assert {"name": "gloo-http", "containerPort": port + 1, "hostPort": port + 1} in pod["containers"][0]["ports"]
    env = env_of(pod["containers"][0])
    assert env["PADDLE_PORT"] == str(port)
    assert env["PADDLE_PSERVERS_IP_PORT_LIST"].endswith(f".svc:{port}")


def test_heter_trainers_get_their_workload_and_the_heter_ps_environment():
    heter = role(2, command=False)
    heter["template"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    spec = translate(paddlejob(ps=role(1), worker=role(3), heter=heter)).validate()
    objects = manifests.master_objects(spec, None)
    sets = {d["metadata"]["name"]: d for d in objects if d["kind"] == "StatefulSet"}
    assert sets["pj-heter"]["spec"]["replicas"] == 2
    heter_pod = sets["pj-heter"]["spec"]["template"]["spec"]
    env = env_of(heter_pod["containers"][0])
    heters = "pj-heter-0.pj-heter.ml.svc:36000,pj-heter-1.pj-heter.ml.svc:36000"
    assert env["TRAINING_ROLE"] == "HETER_TRAINER" and env["STAGE_ID"] == "2"
    assert env["HETER_DEVICE_TYPE"] == "gpu" and env["STAGE_NUM"] == "2"
    assert env["PADDLE_ALL_HETER_TRAINER_IP_PORT_LIST"] == heters
    assert env["PADDLE_PREVIOUS_HETER_TRAINER_IP_PORT_LIST"].split(",")[2] == "pj-trainer-2.pj-trainer.ml.svc:36000"
    assert [c["name"] for c in heter_pod["initContainers"]] == ["wait-master", "wait-pservers"]
    trainer = env_of(next(d for d in objects if d["kind"] == "Job")["spec"]["template"]["spec"]["containers"][0])
    assert trainer["STAGE_ID"] == "1" and trainer["PADDLE_NEXT_HETER_TRAINER_IP_PORT_LIST"] == heters
    assert trainer["PADDLE_STAGE_TRAINERS_NUM"] == "[3, 2]"
    for doc in objects:
        check(doc, SIDECAR_VERSIONS)


# ---- images that do not contain paddlecloud --------------------------------------------------
def test_an_entrypoint_only_image_runs_unchanged_with_paddlecloud_beside_it():
    spec = translate(paddlejob(ps=role(2, command=False), worker=role(3, command=False),
                               withGloo=1)).validate()
    ps = manifests.pserver_statefulset(spec, None)["spec"]["template"]["spec"]
    trainer = manifests.trainer_job(spec, None)["spec"]["template"]["spec"]
    for pod in (ps, trainer):
        main = pod["containers"][0]
        assert "command" not in main and "args" not in main and main["image"] == "img"
    # the full environment PaddlePaddle reads
    ps_env, trainer_env = env_of(ps["containers"][0]), env_of(trainer["containers"][0])
    for env in (ps_env, trainer_env):
        assert {"TRAINING_ROLE", "PADDLE_PSERVERS_IP_PORT_LIST", "PADDLE_TRAINERS_NUM", "POD_IP",
                "PADDLE_PORT", "PADDLE_JOB_NAME", "PADDLE_ETCD_ENDPOINTS"} <= set(env)
    assert {"PADDLE_TRAINER_ID", "PADDLE_TRAINER_ENDPOINTS", "PADDLE_WITH_GLOO",
            "PADDLE_GLOO_HTTP_ENDPOINT"} <= set(trainer_env)
    assert "PADDLE_PSERVER_ID" in ps_env
    # trainers: init containers hold them until the master serves and every pserver listens
    wait_master, wait = trainer["initContainers"]
    assert wait_master["image"] == wait["image"] == spec.paddlecloud_image
    assert "restartPolicy" not in wait and "restartPolicy" not in wait_master
    assert wait_master["command"] == ["paddlecloud", "trainer"]
    assert wait_master["volumeMounts"] == [{"name": "job-tokens", "mountPath": manifests.TOKENS_MOUNT,
                                            "readOnly": True}]
    assert wait["command"] == ["python3", "-m", "paddlecloud.backends.k8s.portwatch", "--wait",
                               "$(PADDLE_PSERVERS_IP_PORT_LIST)"]
    assert env_of(wait)["PADDLE_PSERVERS_IP_PORT_LIST"] == ps_env["PADDLE_PSERVERS_IP_PORT_LIST"]
    # pservers: a native sidecar runs the pserver agent, which registers the pod in etcd
    (sidecar,) = ps["initContainers"]
    assert sidecar["restartPolicy"] == "Always" and sidecar["image"] == spec.paddlecloud_image
    assert sidecar["command"][:3] == ["paddlecloud", "pserver", "--"]
    assert sidecar["command"][3:] == ["python3", "-m", "paddlecloud.backends.k8s.portwatch", "--hold",
                                      "127.0.0.1:$(PADDLE_PORT)"]
    # the agent claims the same slot; it alone gets the job's etcd credentials
    main_env = ps["containers"][0]["env"]
    assert sidecar["env"][:len(main_env)] == main_env
    assert {"PADDLE_ETCD_USER", "PADDLE_ETCD_PASSWORD_FILE"} <= set(env_of(sidecar))
    assert not {n for n in ps_env if n.startswith("PADDLE_ETCD_") and n != "PADDLE_ETCD_ENDPOINTS"}
    assert not any(m["name"].startswith("etcd-") for m in ps["containers"][0].get("volumeMounts") or [])
    for doc in (manifests.pserver_statefulset(spec, None), manifests.trainer_job(spec, None)):
        check(doc, SIDECAR_VERSIONS)
        assert doc["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_a_templates_command_runs_as_written_and_the_module_in_the_job_s_image():
    """Never `paddlecloud trainer -- ...`: the user's image need not hold paddlecloud."""
    spec = translate(paddlejob(ps=role(1)), paddlecloud_image="reg/pc:1").validate()
    for doc in (manifests.trainer_job(spec, None), manifests.pserver_statefulset(spec, None)):
        pod = doc["spec"]["template"]["spec"]
        assert pod["containers"][0]["command"] == ["python", "train.py"]
        assert pod["containers"][0]["image"] == "img"
        assert {c["image"] for c in pod["initContainers"]} == {"reg/pc:1"}
    flags = JobSpec(name="f", module="m.train", image="user/img:2", pservers=1).validate()
    pod = manifests.trainer_job(flags, None)["spec"]["template"]["spec"]
    assert pod["containers"][0]["command"] == ["python3", "-m", "m.train"]
    assert pod["containers"][0]["image"] == "user/img:2"
    assert [c["name"] for c in pod["initContainers"]] == ["wait-master", "wait-pservers"]


def test_an_init_container_of_the_template_runs_after_ours():
    spec = translate(paddlejob(ps=role(1), worker=role(
        1, command=False, initContainers=[{"name": "fetch", "image": "busybox"}]))).validate()
    pod = manifests.trainer_job(spec, None)["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["wait-master", "wait-pservers", "fetch"]


# ---- job submit --------------------------------------------------------------------------------
def _submit(*args: str) -> Any:
    return CliRunner().invoke(job, ["submit", *args, "--dry-run"], catch_exceptions=False)


def test_submit_format_and_chunk_bytes_are_checked_up_front_and_stored():
    result = _submit("t", "--module", "m", "--format", "file", "--chunk-bytes", "1GiB")
    assert result.exit_code == 0, result.output
    spec_doc = next(d for d in yaml.safe_load_all(result.output) if d["kind"] == "ConfigMap")
    stored = JobSpec.from_yaml(spec_doc["data"][manifests.SPEC_KEY])
    assert (stored.data_format, stored.chunk_bytes) == ("file", 1024**3)
    bad = _submit("t", "--module", "m", "--chunk-bytes", "huge")
    assert bad.exit_code != 0 and "'huge'" in bad.output
    bad = _submit("t", "--module", "m", "--format", "parquet")
    assert bad.exit_code != 0 and "'parquet'" in bad.output


def test_submit_f_takes_a_paddlejob_with_its_podgroup(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text((REPO / "deploy/examples/resnet-volcano-podgroup.yaml").read_text())
    result = _submit("-f", str(path), "--chunk-bytes", "8MiB")
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(result.output))
    group = next(d for d in docs if d["kind"] == "PodGroup")
    assert group["spec"]["queue"] == "research" and group["spec"]["minMember"] == 4
    misspelt = tmp_path / "typo.yaml"
    misspelt.write_text(yaml.safe_dump(paddlejob(cleanPolicy="Never")))
    result = _submit("-f", str(misspelt))
    assert result.exit_code != 0 and "did you mean spec.cleanPodPolicy?" in result.output


def test_submit_runs_the_module_bare_with_paddlecloud_beside_it():
    result = _submit("t", "--module", "m.train", "--pservers", "1", "--image", "user/img:1",
                     "--paddlecloud-image", "reg/paddlecloud:2")
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(result.output))
    pods = {d["kind"]: d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("Job", "StatefulSet")}
    assert pods["Job"]["containers"][0]["command"] == ["python3", "-m", "m.train"]
    assert pods["StatefulSet"]["containers"][0]["command"] == ["python3", "-m", "m.train"]
    assert [c["name"] for c in pods["Job"]["initContainers"]] == ["wait-master", "wait-pservers"]
    assert [c["name"] for c in pods["StatefulSet"]["initContainers"]] == ["paddlecloud-agent"]
    for pod in pods.values():
        assert pod["containers"][0]["image"] == "user/img:1"
        assert {c["image"] for c in pod["initContainers"]} == {"reg/paddlecloud:2"}
    for doc in docs:
        check(doc, SIDECAR_VERSIONS)
