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
    ("ROOT=paddlecloud-etcd-admin/password", ["paddlecloud-etcd-admin", "Secret of paddlecloud's own"]),
    ("T=victim-tokens/operator", ["victim-tokens", "Secret of paddlecloud's own"]),
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


def _container(**context: Any) -> dict[str, Any]:
    return {"container": {"securityContext": context}}


# the baseline Pod Security Standard's other checks: each passed into the pods before
BASELINE = {
    "hostPort": ({"container": {"ports": [{"containerPort": 80, "hostPort": 80}]}},
                 "containers[0].ports[0].hostPort (80)"),
    "SELinux type": (_container(seLinuxOptions={"type": "spc_t"}), "seLinuxOptions.type (spc_t)"),
    "SELinux user": ({"securityContext": {"seLinuxOptions": {"user": "system_u"}}},
                     "spec.securityContext.seLinuxOptions.user (system_u)"),
    "AppArmor field": (_container(appArmorProfile={"type": "Unconfined"}), "appArmorProfile (Unconfined)"),
    "procMount": (_container(procMount="Unmasked"), "securityContext.procMount (Unmasked)"),
    "sysctl": ({"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}},
               "spec.securityContext.sysctls[0] (kernel.msgmax)"),
    "gitRepo": ({"volumes": [{"name": "code", "gitRepo": {"repository": "https://example.com/r"}}]},
                "spec.volumes[0].gitRepo"),
    "hostProcess": (_container(windowsOptions={"hostProcess": True}), "windowsOptions.hostProcess (true)"),
    "seccomp": ({"securityContext": {"seccompProfile": {"type": "Unconfined"}}},
                "spec.securityContext.seccompProfile (Unconfined)"),
    "projected token": ({"volumes": [{"name": "t", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token"}}]}}]},
        "spec.volumes[0].projected.sources[0].serviceAccountToken"),
    "ephemeral": ({"ephemeralContainers": [{"name": "d", "image": "i", "securityContext": {"privileged": True}}]},
                  "spec.ephemeralContainers[0].securityContext.privileged (true)"),
}


@pytest.mark.parametrize(("pod", "field"), BASELINE.values(), ids=BASELINE.keys())
def test_a_template_past_the_baseline_standard_is_refused_naming_the_field_and_value(pod, field):
    doc = _paddlejob(**copy.deepcopy(pod))
    with pytest.raises(JobSpecError) as caught:
        translate(doc).validate()
    assert field in str(caught.value) and "--allow-privileged" in str(caught.value), caught.value
    translate(doc, allow_privileged=True).validate()


def test_an_apparmor_unconfined_annotation_is_refused():
    doc = _paddlejob()
    doc["spec"]["worker"]["template"]["metadata"] = {"annotations": {
        "container.apparmor.security.beta.kubernetes.io/paddle": "unconfined"}}
    with pytest.raises(JobSpecError) as caught:
        translate(doc).validate()
    assert "metadata.annotations[container.apparmor.security.beta.kubernetes.io/paddle] (unconfined)" \
        in str(caught.value)
    doc["spec"]["worker"]["template"]["metadata"]["annotations"] = {
        "container.apparmor.security.beta.kubernetes.io/paddle": "runtime/default"}
    translate(doc).validate()


OWN_SECRETS = {
    "envFrom etcd admin": ({"container": {"envFrom": [{"secretRef": {"name": "paddlecloud-etcd-admin"}}]}},
                           "containers[0].envFrom[0].secretRef.name (paddlecloud-etcd-admin)"),
    "env of client TLS": ({"container": {"env": [{"name": "K", "valueFrom": {"secretKeyRef": {
        "name": "paddlecloud-etcd-client-tls", "key": "tls.key"}}}]}},
        "env[0].valueFrom.secretKeyRef.name (paddlecloud-etcd-client-tls)"),
    "another job's tokens": ({"volumes": [{"name": "t", "secret": {"secretName": "victim-tokens"}}]},
                             "spec.volumes[0].secret.secretName (victim-tokens)"),
    "projected etcd user": ({"volumes": [{"name": "t", "projected": {"sources": [
        {"secret": {"name": "victim-etcd"}}]}}]}, "projected.sources[0].secret.name (victim-etcd)"),
}


@pytest.mark.parametrize(("pod", "field"), OWN_SECRETS.values(), ids=OWN_SECRETS.keys())
def test_paddleclouds_own_secrets_are_refused_even_with_allow_privileged(pod, field):
    doc = _paddlejob(**copy.deepcopy(pod))
    for allowed in (False, True):
        with pytest.raises(JobSpecError) as caught:
            translate(doc, allow_privileged=allowed).validate()
        assert field in str(caught.value) and "Secret of paddlecloud's own" in str(caught.value), caught.value
