"""No two jobs render an object of the same kind and name, whatever their names.

Every name a job renders is the job's name and a suffix; two jobs collide when one job's
name plus a suffix is another's name plus another suffix: `fit-master` + `-egress` once was
`fit` + `-master-egress`. So for a job with every part (pservers, heters, a trainer range,
Volcano, Kueue) every name it renders is cut at each `-`, each cut is rendered as a job in
turn, and the two jobs' (kind, name) pairs must be disjoint. Pure: nothing runs.
"""

from __future__ import annotations

import asyncio

import pytest
from conftest import RESOURCES

from paddlecloud.backends.k8s import manifests
from paddlecloud.backends.k8s.image_build import build_job_name
from paddlecloud.etcd_users import job_user_name
from paddlecloud.jobspec import MAX_NAME_LENGTH, JobSpec
from pdj_operator.kueue import workload_name

HETER = {"spec": {"containers": [{"name": "heter", "image": "paddle:2"}]}}


def spec_of(name: str) -> JobSpec:
    return JobSpec(name=name, namespace="team", module="m.train", pservers=2, heters=2, heter_template=HETER,
                   trainers=3, min_trainers=1, max_trainers=12, scheduler_name="volcano")


def rendered(name: str) -> set[tuple[str, str]]:
    """(kind, name) of everything any backend renders for job `name` at its largest size."""
    spec = spec_of(name)
    most = spec.replace(trainers=spec.trainer_range.maximum)
    objects = [*manifests.submit_objects(most), manifests.pserver_statefulset(most, None),
               manifests.heter_statefulset(most, None), manifests.trainer_job(most, None),
               manifests.podgroup(most, None),
               *(s for role in (manifests.PSERVER, manifests.HETER, manifests.TRAINER)
                 for s in manifests.role_services(most, role, owner=None))]
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    # made beside them by `job submit`, the operator and the Job Server
    names |= {("Secret", manifests.tokens_secret_name(name)), ("Secret", manifests.etcd_user_secret_name(name)),
              ("ConfigMap", manifests.package_configmap_name(name)), ("Workload", workload_name(name)),
              ("etcd user", job_user_name("team", name))}
    return names


def cuts(names: set[tuple[str, str]]) -> set[str]:
    """Every prefix of a rendered name that ends before a '-': the job names that could collide."""
    out = set()
    for _, name in names:
        parts = name.split("-")
        out |= {"-".join(parts[:n]) for n in range(1, len(parts))}
    return {c for c in out if c and len(c) <= MAX_NAME_LENGTH and not c.endswith("-")}


@pytest.mark.parametrize("job", ["fit", "my-fit", "a-b-c"])
def test_no_two_jobs_render_an_object_of_the_same_kind_and_name(job):
    mine = rendered(job)
    assert {kind for kind, _ in mine} >= {"Deployment", "Service", "StatefulSet", "Job", "NetworkPolicy",
                                          "Secret", "ConfigMap", "ServiceAccount", "Role", "RoleBinding",
                                          "PodGroup"}
    others = cuts(mine) - {job}
    assert f"{job}-master" in others and f"{job}-ps" in others
    for other in sorted(others):
        shared = mine & rendered(other)
        assert not shared, f"jobs {job!r} and {other!r} both render {sorted(shared)}"


def test_the_build_job_is_no_jobs_name():
    # the Job Server's image build Job: `paddlecloud-build-` and a hex tag, never NAME-trainer
    assert not build_job_name("0123456789abcdef" * 4).endswith("-trainer")


def test_a_job_named_fit_keeps_readable_names():
    names = rendered("fit")
    assert ("NetworkPolicy", "fit-master-egress") in names and ("NetworkPolicy", "fit-job-egress") in names
    assert ("Deployment", "fit-master") in names and ("Secret", "fit-tokens") in names


async def test_submitting_fit_master_beside_fit_leaves_fits_objects_alone(k8s, api_client):
    from paddlecloud.backends.k8s.jobs import create_job

    fit = spec_of("fit").replace(heters=0, heter_template=None, scheduler_name=None)
    # in a thread: the client blocks, and kmock serves on this test's event loop
    await asyncio.to_thread(create_job, api_client, spec=fit, objects=manifests.submit_objects(fit))
    before = {n: k8s.stored("networkpolicies", "team", n) for n in
              ("fit-internal", "fit-master", "fit-job-egress", "fit-master-egress", "fit-ps-egress")}
    for other in ("fit-master", "fit-ps"):
        spec = fit.replace(name=other)
        await asyncio.to_thread(create_job, api_client, spec=spec, objects=manifests.submit_objects(spec))
    for name, policy in before.items():
        after = k8s.stored("networkpolicies", "team", name)
        assert after["spec"] == policy["spec"], name
        assert after["metadata"]["labels"][manifests.JOB_LABEL] == "fit", name
        assert after["metadata"].get("ownerReferences") == policy["metadata"].get("ownerReferences"), name
    assert RESOURCES  # the emulator's resource table is the one the other tests use
