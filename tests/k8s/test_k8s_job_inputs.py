"""What a submitter may ask of paddlecloud's pods: env from Secrets (never a value in a
ConfigMap), and pod templates refused when they ask for more than the restricted profile
unless `--allow-privileged` is given."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from rendered_objects import pod_spec
from restricted_profile import violations

from paddlecloud.backends.k8s import manifests
from paddlecloud.cli.jobs import job
from paddlecloud.jobspec import JobSpec, JobSpecError
from paddlecloud.paddlejob import translate

pytestmark = pytest.mark.unit


def submit(*args: str) -> Any:
    return CliRunner().invoke(job, ["submit", *args, "--dry-run"], catch_exceptions=False)


def _docs(output: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(output) if d]


def test_secret_env_is_a_secret_key_ref_and_never_a_value_in_a_configmap():
    result = submit("sec", "--module", "m.train", "--pservers", "1", "-e", "PLAIN=visible",
                    "--secret-env", "API_TOKEN=creds/token")
    assert result.exit_code == 0, result.output
    docs = _docs(result.output)
    ref = {"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}}
    pods = {d["metadata"]["name"]: pod_spec(d) for d in docs if pod_spec(d) is not None}
    for name in ("sec-trainer", "sec-ps"):
        env = pods[name]["containers"][0]["env"]
        assert ref in env, name
        assert {"name": "PLAIN", "value": "visible"} in env
    spec_text = next(d for d in docs if d["kind"] == "ConfigMap")["data"][manifests.SPEC_KEY]
    assert JobSpec.from_yaml(spec_text).secret_env == (("API_TOKEN", "creds", "token"),)
    assert "visible" in spec_text  # a plain -e value is in the spec; a Secret's never is


@pytest.mark.parametrize(("flag", "words"), [
    ("API_TOKEN", ["'API_TOKEN'", "NAME=SECRET/KEY"]),
    ("API_TOKEN=creds", ["'API_TOKEN=creds'", "NAME=SECRET/KEY"]),
    ("API_TOKEN=Creds!/token", ["'Creds!'", "DNS-1123"]),
    ("API_TOKEN=creds/to ken", ["'to ken'"]),
    ("PADDLE_TRAINER_ID=creds/id", ["PADDLE_TRAINER_ID", "set by paddlecloud"]),
])
def test_a_bad_secret_env_is_refused_naming_it(flag, words):
    result = submit("sec", "--module", "m.train", "--secret-env", flag)
    assert result.exit_code != 0
    for word in words:
        assert word in result.output, result.output


def test_a_secret_env_name_given_twice_is_refused():
    result = submit("sec", "--module", "m.train", "-e", "A=1", "--secret-env", "A=creds/a")
    assert result.exit_code != 0 and "A is given twice" in result.output


def _paddlejob(**pod: Any) -> dict[str, Any]:
    container = {"name": "paddle", "image": "img", "command": ["python", "train.py"],
                 "env": [{"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {
                     "name": "db", "key": "password"}}}]}
    container.update(pod.pop("container", {}))
    worker = {"replicas": 2, "template": {"spec": {"containers": [container], **pod}}}
    return {"apiVersion": "batch.paddlepaddle.org/v1", "kind": "PaddleJob",
            "metadata": {"name": "pj"}, "spec": {"worker": worker}}


UNSAFE = {
    "privileged": ({"container": {"securityContext": {"privileged": True}}},
                   "spec.worker.template.spec.containers[0].securityContext.privileged"),
    "hostNetwork": ({"hostNetwork": True}, "spec.worker.template.spec.hostNetwork"),
    "hostPID": ({"hostPID": True}, "spec.worker.template.spec.hostPID"),
    "hostIPC": ({"hostIPC": True}, "spec.worker.template.spec.hostIPC"),
    "hostPath": ({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]},
                 "spec.worker.template.spec.volumes[0].hostPath"),
    "master's account": ({"serviceAccountName": manifests.master_account_name("other")},
                         "spec.worker.template.spec.serviceAccountName"),
    "root": ({"securityContext": {"runAsUser": 0}},
             "spec.worker.template.spec.securityContext.runAsUser"),
    "capabilities": ({"container": {"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}},
                     "securityContext.capabilities.add (SYS_ADMIN)"),
    "escalation": ({"container": {"securityContext": {"allowPrivilegeEscalation": True}}},
                   "containers[0].securityContext.allowPrivilegeEscalation"),
}


@pytest.mark.parametrize(("pod", "field"), UNSAFE.values(), ids=UNSAFE.keys())
def test_an_unsafe_template_is_refused_naming_the_field_unless_allowed(pod, field):
    doc = _paddlejob(**copy.deepcopy(pod))
    with pytest.raises(JobSpecError) as caught:
        translate(doc).validate()
    assert field in str(caught.value) and "--allow-privileged" in str(caught.value)
    spec = translate(doc, allow_privileged=True).validate()
    rendered = manifests.trainer_job(spec, None)["spec"]["template"]["spec"]
    # allowed, and kept as asked: it is no longer restricted (or has the account's rights)
    assert violations(rendered) or rendered["serviceAccountName"] == manifests.master_account_name("other")


def test_the_cli_flag_allows_it(tmp_path):
    path = tmp_path / "pj.yaml"
    path.write_text(yaml.safe_dump(_paddlejob(hostNetwork=True)))
    refused = submit("-f", str(path))
    assert refused.exit_code != 0 and "spec.worker.template.spec.hostNetwork" in refused.output
    allowed = submit("-f", str(path), "--allow-privileged")
    assert allowed.exit_code == 0, allowed.output
    trainer = next(d for d in _docs(allowed.output) if d["kind"] == "Job")
    assert pod_spec(trainer)["hostNetwork"] is True


def test_a_templates_own_secret_ref_stays_a_secret_ref():
    spec = translate(_paddlejob(), security_profile="restricted").validate()
    pod = manifests.trainer_job(spec, None)["spec"]["template"]["spec"]
    assert {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}} \
        in pod["containers"][0]["env"]
    assert violations(pod) == []
