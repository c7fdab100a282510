"""The group restart limit on Kubernetes is the job's (`JobSpec.restart_limit`), not a constant.

`job submit --restart-limit N` and a PaddleJob's `spec.restartLimit` set it; the
master's deployer, built from the spec alone (as master/deployment.py builds it),
gives up after that many group restarts (kmock plays the API server).
"""

from __future__ import annotations

import pytest
from test_k8s_deployer import FAST_RETRY, NS, create_master, make_spec, short
from test_k8s_elastic import EpochRestarts, add_group, delete_pod

from paddlecloud.backends.k8s import manifests
from paddlecloud.backends.k8s.deployer import KubernetesDeployer
from paddlecloud.cli.jobs import build_spec, submit_command
from paddlecloud.jobspec import JobSpec, JobSpecError
from paddlecloud.paddlejob import translate


async def lose_members(k8s, api_client, spec: JobSpec, deployer: KubernetesDeployer, times: int) -> None:
    for generation in "abcdefgh"[:times]:
        pods = add_group(k8s, spec, spec.trainers, generation)
        await deployer.reconcile()
        await delete_pod(api_client, pods[0])
        await deployer.reconcile()


@pytest.mark.parametrize("limit", [0, 2])
async def test_the_deployer_gives_up_after_the_spec_s_restart_limit(k8s, api_client, job_name, limit):
    spec = make_spec(short(job_name), trainers=2, pservers=0, restart_limit=limit)
    await create_master(api_client, spec)
    trainer = manifests.trainer_name(spec.name)
    restarts = EpochRestarts(k8s, trainer)
    deployer = KubernetesDeployer(spec, api_client=api_client, retry=FAST_RETRY, restart_epoch=restarts)
    await deployer.create_trainers()
    await lose_members(k8s, api_client, spec, deployer, limit)
    assert not (await deployer.trainer_status()).gave_up  # `limit` restarts were allowed
    assert len(restarts.jobs_present) == limit
    await lose_members(k8s, api_client, spec, deployer, 1)
    status = await deployer.trainer_status()
    assert status.gave_up and f"--restart-limit {limit}" in status.detail
    assert len(restarts.jobs_present) == limit and k8s.stored("jobs", NS, trainer) is None


def test_the_default_is_three_and_a_negative_limit_is_refused_naming_it():
    assert make_spec("job").restart_limit == 3
    with pytest.raises(JobSpecError, match="restart limit.*-1"):
        make_spec("job", restart_limit=-1)
    assert JobSpec.from_yaml(make_spec("job", restart_limit=5).to_yaml()).restart_limit == 5


def test_submit_s_flag_and_a_paddlejob_s_field_set_it():
    # every option of `job submit` as click passes it when not given
    options = {p.name: (() if p.multiple else None) for p in submit_command.params}
    options.update(inputs=(), env=(), secret_env=(), allow_privileged=False, module="ctr.train",
                   restart_limit=7)
    assert build_spec(name="job", paddlejob=None, package=None, options=options).restart_limit == 7
    doc = {"apiVersion": "batch.paddlepaddle.org/v1", "kind": "PaddleJob",
           "metadata": {"name": "job"},
           "spec": {"restartLimit": 1, "worker": {"replicas": 2, "template": {"spec": {
               "containers": [{"name": "paddle", "image": "paddle:2.5"}]}}}}}
    assert translate(doc).restart_limit == 1
    with pytest.raises(JobSpecError, match="spec.restartLimit"):
        translate({**doc, "spec": {**doc["spec"], "restartLimit": -2}})
