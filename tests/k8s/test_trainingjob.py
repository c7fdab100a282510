"""EDL's TrainingJob (seed 004) through `paddlecloud job submit -f`: rendered as it would run.

`edl/examplejob.yaml` is a TrainingJob in the seed's shape, as EDL's users have it. The
submit path renders it with `--dry-run` (no API server needed); each assertion is a field of
the TrainingJob meaning what it meant under EDL.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from paddlecloud.backends.k8s import manifests
from paddlecloud.cli.jobs import job
from paddlecloud.jobspec import JobSpec, JobSpecError
from paddlecloud.paddlejob import translate
from paddlecloud.trainingjob import to_paddlejob

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).parent / "edl" / "examplejob.yaml"


def submit(path: Path, *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(job, ["submit", "-f", str(path), "--dry-run", *extra], catch_exceptions=False)
    return result.exit_code, result.output


def rendered(path: Path) -> dict[str, dict[str, Any]]:
    code, output = submit(path)
    assert code == 0, output
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in yaml.safe_load_all(output) if d}


def edited(tmp_path: Path, change: Any) -> Path:
    doc = yaml.safe_load(EXAMPLE.read_text())
    change(doc)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_seed_s_trainingjob_is_submitted_as_written(caplog):
    with caplog.at_level(logging.WARNING, logger="paddlecloud.trainingjob"):
        objects = rendered(EXAMPLE)
    spec = JobSpec.from_yaml(objects["ConfigMap/example-spec"]["data"][manifests.SPEC_KEY])
    # min-instance..max-instance is the elastic range the autoscaler and `job scale` act on
    assert (spec.trainers, spec.min_trainers, spec.max_trainers, spec.pservers) == (2, 2, 6, 2)
    assert spec.epochs == 10
    trainer = objects["Job/example-trainer"]["spec"]["template"]["spec"]["containers"][0]
    pserver = objects["StatefulSet/example-ps"]["spec"]["template"]["spec"]["containers"][0]
    assert objects["StatefulSet/example-ps"]["spec"]["replicas"] == 2
    # the trainers' entrypoint runs unwrapped, as EDL's `sh -c "$ENTRY"`, in the workspace; the
    # pservers run what EDL's controller ran in them: the image's `paddle_k8s start_new_pserver`
    assert trainer["command"] == ["sh", "-c", "python train.py"] and trainer["workingDir"] == "/workspace"
    assert pserver["command"] == ["paddle_k8s", "start_new_pserver"] and "workingDir" not in pserver
    for container, role in ((trainer, "TRAINER"), (pserver, "PSERVER")):
        assert container["image"] == "paddlepaddle/paddlecloud-job"
        assert "args" not in container
        assert container["resources"] == {"limits": {"cpu": "800m", "memory": "1Gi"},
                                          "requests": {"cpu": "500m", "memory": "600Mi"}}
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["PADDLE_INIT_NUM_PASSES"] == "10" and env["TRAINING_ROLE"] == role
        assert (env["PADDLE_INIT_PORT"], env["PADDLE_INIT_PORTS_NUM"],
                env["PADDLE_INIT_PORTS_NUM_FOR_SPARSE"]) == ("7164", "1", "1")
        assert (env["ENTRY"], env["TRAINER_PACKAGE"], env["TRAINERS"], env["PSERVERS"]) == (
            "python train.py", "/workspace", "2", "2")
    # `master:` is EDL's per-job master, paddlecloud's own here: said, not silently dropped
    assert "spec.master.resources is not applied" in caplog.text


def test_edl_s_volumes_mounts_node_selector_and_host_network_reach_every_pod(tmp_path):
    """EDL's TrainingJobSpec fields beyond the example's (types.go): Volumes, VolumeMounts
    (`mountPath`; Go read the key in any case), NodeSelector, imagePullSecrets, host_network,
    passes in `spec`; a pserver entrypoint of one's own."""
    def change(doc: dict) -> None:
        doc["spec"].update(
            volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "nfs-pvc"}}],
            volumeMounts=[{"name": "data", "mountPath": "/nas"}],
            NodeSelector={"accelerator": "nvidia-tesla-p100"},
            imagePullSecrets=[{"name": "myregistrykey"}], host_network=True, passes=10,
            fault_tolerant=False)
        doc["spec"]["pserver"]["entrypoint"] = "python pserver.py"
    objects = rendered(edited(tmp_path, change))
    trainer = objects["Job/example-trainer"]["spec"]["template"]["spec"]
    pserver = objects["StatefulSet/example-ps"]["spec"]["template"]["spec"]
    for pod in (trainer, pserver):
        assert {"name": "data", "persistentVolumeClaim": {"claimName": "nfs-pvc"}} in pod["volumes"]
        assert {"name": "data", "mountPath": "/nas"} in pod["containers"][0]["volumeMounts"]
        assert pod["nodeSelector"] == {"accelerator": "nvidia-tesla-p100"}
        assert pod["imagePullSecrets"] == [{"name": "myregistrykey"}]
        assert pod["hostNetwork"] is True  # paddle-operator's intranet Host
    assert pserver["containers"][0]["command"] == ["sh", "-c", "python pserver.py"]
    assert pserver["containers"][0]["workingDir"] == "/workspace"
    without = objects_of(tmp_path, lambda d: d["spec"].update(fault_tolerant=False))
    ps = without["StatefulSet/example-ps"]["spec"]["template"]["spec"]["containers"][0]
    assert ps["command"] == ["paddle_k8s", "start_pserver"]  # EDL's pserver without fault tolerance


def objects_of(tmp_path: Path, change: Any) -> dict[str, dict[str, Any]]:
    return rendered(edited(tmp_path, change))


def test_a_trainingjob_is_the_paddlejob_it_converts_to():
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"].update(labels={"team": "a"}, annotations={
        "kubectl.kubernetes.io/last-applied-configuration": "{}", "paddlecloud.org/last-handled-configuration": "{}"})
    converted = to_paddlejob(doc)
    # the labels go with it; kubectl's and the operator's annotations are the TrainingJob's
    assert converted["kind"] == "PaddleJob" and converted["metadata"] == {"name": "example", "labels": {"team": "a"}}
    worker = converted["spec"]["worker"]
    assert (worker["replicas"], worker["requests"], worker["limits"]) == (2, 2, 6)
    assert translate(converted).validate().trainer_range.maximum == 6


def test_a_pserver_range_runs_min_instance_pservers_with_a_warning(tmp_path, caplog):
    path = edited(tmp_path, lambda d: d["spec"]["pserver"].update({"min-instance": 1, "max-instance": 3}))
    with caplog.at_level(logging.WARNING, logger="paddlecloud.trainingjob"):
        objects = rendered(path)
    assert objects["StatefulSet/example-ps"]["spec"]["replicas"] == 1
    assert "min-instance 1 and max-instance 3 differ; paddlecloud runs 1 pservers" in caplog.text


@pytest.mark.parametrize("change, fragment", [
    (lambda d: d["spec"]["trainer"].update({"min-instance": 7}),
     "spec.trainer: min-instance 7 is more than max-instance 6"),
    (lambda d: d["spec"].pop("image"), "the TrainingJob has no spec.image"),
    (lambda d: d["spec"]["trainer"].update({"max_instance": 3}),
     "unknown field spec.trainer.max_instance: did you mean spec.trainer.max-instance?"),
    (lambda d: d["spec"].update({"fault_tolerent": True}),
     "unknown field spec.fault_tolerent: did you mean spec.fault_tolerant?"),
    (lambda d: d["spec"]["trainer"].update({"passes": 0}), "invalid spec.trainer.passes 0"),
    (lambda d: d["spec"]["trainer"].pop("entrypoint"), "no spec.trainer.entrypoint"),
    (lambda d: d.update({"apiVersion": "paddlepaddle.org/v2"}),
     "TrainingJob apiVersion 'paddlepaddle.org/v2' is not supported: use paddlepaddle.org/v1"),
    (lambda d: d["spec"]["master"].update({"etcd-endpoint": "http://etcd:2379"}),
     "spec.master.etcd-endpoint is not taken: the job's master uses the etcd of paddlecloud's "
     "install, not one per job: give it with `paddlecloud job submit --etcd-endpoints`"),
    (lambda d: d["spec"]["pserver"].update({"replicaSpec": {"spec": {}}}),
     "spec.pserver.replicaSpec is not taken: EDL's controller generated the pserver's workload itself "
     "and replaced this one; for pods of your own write a PaddleJob (batch.paddlepaddle.org/v1) "
     "with `spec.ps.template`"),
    (lambda d: d["spec"].update({"passes": 3}),
     "spec.passes 3 and spec.trainer.passes 10 differ: give the job's passes once"),
    (lambda d: d["spec"].update({"VolumeMounts": [], "volumeMounts": []}),
     "spec.VolumeMounts and spec.volumeMounts are the same field"),
    (lambda d: d["spec"].update({"VolumeMounts": [{"name": "data"}]}), "spec.VolumeMounts[0] has no mountPath"),
])
def test_bad_trainingjobs_are_one_error_naming_the_field(tmp_path, change, fragment):
    code, output = submit(edited(tmp_path, change))
    assert code != 0 and fragment in output, output
    assert output.count("Error") == 1 and "Traceback" not in output
    with pytest.raises(JobSpecError, match=re.escape(fragment)):
        to_paddlejob(yaml.safe_load(edited(tmp_path, change).read_text()))


def test_flags_that_shape_the_pods_are_refused_beside_a_trainingjob():
    code, output = submit(EXAMPLE, "--trainers", "3")
    assert code != 0 and "--trainers cannot be combined with -f" in output
