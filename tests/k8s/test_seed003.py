"""paddle-operator's tutorial (seed 003), Examples 1-5 verbatim (tests/k8s/seed003/): each field
means what it means under paddle-operator, users' containers run as written, and a job that
could never start where it is going is refused before anything is created.

Running the rendered pods on a container engine: tests/k8s/test_run_rendered_pods.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from paddlecloud.backends.k8s import manifests
from paddlecloud.cli.jobs import job
from paddlecloud.jobspec import DEFAULT_IMAGE, JobSpec, JobSpecError
from paddlecloud.paddlejob import load_documents, translate, translate_documents

SEEDS = Path(__file__).resolve().parent / "seed003"
EXAMPLES = sorted(SEEDS.glob("example[1-3]_*.yaml"))
EXAMPLE_4 = SEEDS / "example4_wide_and_deep_volcano.yaml"


def spec_of(name: str) -> JobSpec:
    path = SEEDS / name
    return translate_documents(load_documents(path.read_text(), source=str(path)), source=str(path)).validate()


def workloads(spec: JobSpec) -> dict[str, dict]:
    """role -> the pod spec its workload renders."""
    return {d["metadata"]["labels"][manifests.ROLE_LABEL]: d["spec"]["template"]
            for d in manifests.master_objects(spec, None) if d["kind"] in ("StatefulSet", "Job")}


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env") or []}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_1_to_3_are_accepted_as_written(path):
    result = CliRunner().invoke(job, ["submit", "-f", str(path), "--dry-run"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    kinds = [d["kind"] for d in yaml.safe_load_all(result.output) if d]
    assert "Job" in kinds and "Deployment" in kinds


def test_example_5_s_typo_is_refused_with_its_suggestion():
    result = CliRunner().invoke(job, ["submit", "-f", str(SEEDS / "example5_data_demo.yaml"), "--dry-run"])
    assert result.exit_code != 0
    assert "unknown field spec.cleanPolicy: did you mean spec.cleanPodPolicy?" in result.output


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_user_container_keeps_its_image_command_args_and_user(path):
    paddlejob = next(d for d in load_documents(path.read_text()) if d["kind"] == "PaddleJob")
    written = {role: paddlejob["spec"][field]["template"]["spec"]["containers"][0]
               for role, field in (("trainer", "worker"), ("pserver", "ps")) if field in paddlejob["spec"]}
    for role, template in workloads(spec_of(path.name)).items():
        pod = template["spec"]
        user = pod["containers"][0]
        for key in ("image", "command", "args", "workingDir"):
            assert user.get(key) == written[role].get(key), (role, key)
        # the image's user: nothing paddlecloud adds picks another, nor takes the WORKDIR away
        assert "runAsUser" not in user["securityContext"] and "runAsNonRoot" not in user["securityContext"]
        assert not {"runAsUser", "runAsGroup", "runAsNonRoot", "fsGroup"} & set(pod["securityContext"])
        assert user["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        # paddlecloud's own containers beside it: its image, restricted, as their own user
        for helper in pod["initContainers"]:
            assert helper["image"] == DEFAULT_IMAGE
            assert helper["securityContext"]["runAsNonRoot"] is True
            assert helper["securityContext"]["runAsUser"] == manifests.RUN_AS_USER


def test_example_3_s_intranet_service_gives_every_pod_of_every_role_its_service():
    spec = spec_of("example3_wide_and_deep_gpu.yaml")
    services = {d["metadata"]["name"]: d for d in manifests.master_objects(spec, None) if d["kind"] == "Service"}
    assert {"wide-ande-deep-ps-0", "wide-ande-deep-ps-1", "wide-ande-deep-trainer-0",
            "wide-ande-deep-trainer-1"} <= set(services)
    assert services["wide-ande-deep-trainer-1"]["spec"]["selector"][manifests.COMPLETION_INDEX_LABEL] == "1"
    pods = workloads(spec)
    trainer = env_of(pods["trainer"]["spec"]["containers"][0])
    assert trainer["PADDLE_PSERVERS_IP_PORT_LIST"] == (
        "wide-ande-deep-ps-0.default.svc:36000,wide-ande-deep-ps-1.default.svc:36000")
    assert trainer["PADDLE_TRAINER_ENDPOINTS"] == (
        "wide-ande-deep-trainer-0.default.svc:36000,wide-ande-deep-trainer-1.default.svc:36000")
    assert env_of(pods["pserver"]["spec"]["containers"][0])["POD_IP"] == "$(POD_NAME).default.svc"
    # and the master may delete every one of them
    names = next(r for r in manifests.master_rules(spec)
                 if r["resources"] == ["services"] and "delete" in r["verbs"])["resourceNames"]
    assert set(services) - {"wide-ande-deep-master"} <= set(names)


def example_4_with(tmp_path: Path, ps_restart_policy: str | None) -> Path:
    """Example 4 with its pservers' restartPolicy changed (None: removed)."""
    docs = load_documents(EXAMPLE_4.read_text())
    pod = next(d for d in docs if d["kind"] == "PaddleJob")["spec"]["ps"]["template"]["spec"]
    pod.pop("restartPolicy")
    if ps_restart_policy is not None:
        pod["restartPolicy"] = ps_restart_policy
    path = tmp_path / EXAMPLE_4.name
    path.write_text(yaml.safe_dump_all(docs))
    return path


def test_example_4_s_pserver_restart_policy_never_is_refused_naming_why_not_changed():
    """Never was silently made Always; a StatefulSet takes Always only, so it is refused."""
    result = CliRunner().invoke(job, ["submit", "-f", str(EXAMPLE_4), "--dry-run"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert ("spec.ps.template.spec.restartPolicy 'Never' cannot be kept: paddlecloud runs the pservers "
            "as a StatefulSet, whose pods take Always only") in result.output
    assert "remove restartPolicy from spec.ps.template.spec, or write Always" in result.output


@pytest.mark.parametrize("role, policy", [("worker", "Always"), ("ps", "OnFailure"), ("worker", "Sometimes")])
def test_a_restart_policy_a_role_s_workload_cannot_take_is_refused(role, policy):
    doc = yaml.safe_load((SEEDS / "example1_wide_and_deep.yaml").read_text())
    doc["spec"][role]["template"]["spec"]["restartPolicy"] = policy
    with pytest.raises(JobSpecError, match=f"spec.{role}.template.spec.restartPolicy '{policy}' cannot be kept"):
        translate(doc)


@pytest.mark.parametrize("ps_policy", [None, "Always"])
def test_example_4_s_podgroup_gangs_every_pod_of_the_job_and_its_policies_are_kept(tmp_path, ps_policy):
    path = example_4_with(tmp_path, ps_policy)
    result = CliRunner().invoke(job, ["submit", "-f", str(path), "--dry-run"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    spec = translate_documents(load_documents(path.read_text()), source=str(path)).validate()
    assert spec.min_member == 4 and manifests.gang_size(spec) == 4
    pods = workloads(spec)
    for role, template in pods.items():
        assert template["spec"]["schedulerName"] == "volcano", role
        assert template["metadata"]["annotations"][manifests.PODGROUP_ANNOTATION] == "wide-ande-deep", role
    # as written: the trainers' Never (a Job's pod), the pservers' Always (a StatefulSet's)
    assert (pods["trainer"]["spec"]["restartPolicy"], pods["pserver"]["spec"]["restartPolicy"]) == ("Never", "Always")
    (group,) = [d for d in manifests.master_objects(spec, None) if d["kind"] == "PodGroup"]
    assert group["metadata"]["name"] == "wide-ande-deep" and group["spec"]["minMember"] == 4


def test_a_template_s_capabilities_and_own_user_are_kept():
    doc = yaml.safe_load((SEEDS / "example1_wide_and_deep.yaml").read_text())
    worker = doc["spec"]["worker"]["template"]["spec"]
    worker["containers"][0]["securityContext"] = {"capabilities": {"add": ["NET_BIND_SERVICE"]}}
    worker["securityContext"] = {"runAsUser": 1000, "runAsNonRoot": True}
    pod = workloads(translate(doc).validate())["trainer"]["spec"]
    assert pod["containers"][0]["securityContext"] == {
        "capabilities": {"add": ["NET_BIND_SERVICE"]}, "allowPrivilegeEscalation": False}
    assert pod["securityContext"]["runAsUser"] == 1000 and "fsGroup" not in pod["securityContext"]


def test_the_restricted_profile_runs_the_programs_as_the_uid_the_job_names():
    doc = yaml.safe_load((SEEDS / "example1_wide_and_deep.yaml").read_text())
    doc["spec"].update(securityProfile="restricted", runAsUser=4242)
    for pod in workloads(translate(doc).validate()).values():
        context = pod["spec"]["securityContext"]
        assert (context["runAsNonRoot"], context["runAsUser"], context["fsGroup"]) == (True, 4242, 4242)
    doc["spec"]["securityProfile"] = "default"
    with pytest.raises(JobSpecError, match="run-as user 4242 is the restricted profile's uid"):
        translate(doc).validate()
    doc["spec"]["securityProfile"] = "locked-down"
    with pytest.raises(JobSpecError, match="'locked-down'"):
        translate(doc).validate()


def test_a_template_container_named_as_paddlecloud_s_own_is_refused():
    doc = yaml.safe_load((SEEDS / "example1_wide_and_deep.yaml").read_text())
    doc["spec"]["worker"]["template"]["spec"]["initContainers"] = [{"name": "wait-master", "image": "x"}]
    with pytest.raises(JobSpecError, match="spec.worker.template.spec has a container named 'wait-master'"):
        manifests.master_objects(translate(doc).validate(), None)


def test_no_agent_is_refused_saying_it_is_not_needed():
    doc = yaml.safe_load((SEEDS / "example1_wide_and_deep.yaml").read_text())
    doc["spec"]["noAgent"] = True
    with pytest.raises(JobSpecError, match="spec.noAgent is no longer needed"):
        translate(doc)


# ---- where the job goes -----------------------------------------------------------------------
def _namespace(k8s, name: str, labels: dict[str, str]) -> None:
    k8s.namespace_labels[name] = labels


async def _submit(kubeconfig: str, *args: str):
    runner = CliRunner()
    return await asyncio.to_thread(runner.invoke, job, ["submit", "-f", str(SEEDS / "example1_wide_and_deep.yaml"),
                                                        "--kubeconfig", kubeconfig, *args],
                                   catch_exceptions=False)


async def test_a_root_image_bound_for_a_restricted_namespace_is_refused_before_anything_is_made(
        k8s, kubeconfig):
    _namespace(k8s, "locked", {"pod-security.kubernetes.io/enforce": "restricted"})
    refused = await _submit(kubeconfig, "--namespace", "locked")
    assert refused.exit_code == 1
    assert "namespace locked enforces the restricted Pod Security Standard" in refused.output
    assert "submit with --restricted" in refused.output and "trainer/paddle" in refused.output
    assert k8s.posted() == []
    accepted = await _submit(kubeconfig, "--namespace", "locked", "--restricted")
    assert accepted.exit_code == 0, accepted.output


async def test_a_namespace_without_the_restricted_label_takes_the_job(k8s, kubeconfig):
    _namespace(k8s, "open", {"pod-security.kubernetes.io/enforce": "baseline"})
    accepted = await _submit(kubeconfig, "--namespace", "open")
    assert accepted.exit_code == 0, accepted.output


def test_a_restricted_job_keeps_its_profile_through_the_operator_s_paddlejob():
    from paddlecloud.backends.k8s.jobs import paddlejob_document

    spec = JobSpec(name="r", module="m.train", security_profile="restricted", run_as_user=3000).validate()
    back = translate(paddlejob_document(spec)).validate()
    assert (back.security_profile, back.run_as_user) == ("restricted", 3000)


def test_the_operator_s_image_runs_paddlecloud_s_containers_beside_the_programs():
    from pdj_operator.handlers import OperatorConfig, spec_of

    doc = yaml.safe_load((SEEDS / "example1_wide_and_deep.yaml").read_text())
    spec = spec_of(doc, OperatorConfig(image="reg/paddlecloud:7"))
    for template in workloads(spec).values():
        pod = template["spec"]
        assert pod["containers"][0]["image"] == "registry.baidubce.com/paddle-operator/demo-wide-and-deep:v1"
        assert {c["image"] for c in pod["initContainers"]} == {"reg/paddlecloud:7"}
