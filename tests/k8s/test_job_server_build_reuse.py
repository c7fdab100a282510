"""The Job Server builds a package on a base image once: the store records each image built, so
the pair is reused after its build Job is gone and across server restarts (kmock behind it)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import httpx2
import pytest
from test_job_server import JOB, A, build_config, server, upload

from job_server.config import ConfigError, load_config
from job_server.packages import PackageStore
from paddlecloud import sdk
from paddlecloud.backends.k8s import image_build

BASE = "paddlecloud/paddlecloud:0.1.0"


def build_name(digest: str, base: str = BASE) -> str:
    return image_build.build_job_name(image_build.image_tag(digest, base))


def builds_posted(k8s: Any) -> list[str]:
    return [name for resource, name in k8s.posted() if resource == "jobs"]


async def submit_and_build(k8s: Any, client: httpx2.AsyncClient, job: dict[str, Any],
                           build: str) -> httpx2.Response:
    """Submits `job` and plays the Job controller: the build Job `build` succeeds."""
    submit = asyncio.create_task(client.post("/v1/trainer/job", headers=A, json=job))
    await k8s.wait_for(lambda: k8s.stored("jobs", "builds", build), what=f"build Job {build}")
    k8s.set_job_status("builds", build, {"succeeded": 1})
    return await submit


async def delete_build_job(api_client: Any, name: str) -> None:
    """What the TTL controller does a day after the build ended."""
    from kubernetes import client

    await asyncio.to_thread(client.BatchV1Api(api_client).delete_namespaced_job, name, "builds")


async def test_a_package_on_a_base_image_is_built_once_even_after_its_build_job_is_gone(
        k8s, api_client, tmp_path):
    config = build_config(tmp_path)
    async with server(api_client, tmp_path, build=config) as client:
        digest = await upload(client)
        first = await submit_and_build(k8s, client, {**JOB, "trainer_package": digest},
                                       build_name(digest))
        assert first.status_code == 201, first.text
    await delete_build_job(api_client, build_name(digest))
    assert k8s.stored("jobs", "builds", build_name(digest)) is None
    since = len(k8s.requests())
    async with server(api_client, tmp_path, build=config) as client:  # restarted, same store
        second = await asyncio.wait_for(client.post("/v1/trainer/job", headers=A, json={
            **JOB, "job_name": "fit2", "trainer_package": digest}), timeout=20)
    assert second.status_code == 201, second.text
    assert second.json()["image"] == first.json()["image"]
    assert [r for r in k8s.requests()[since:] if r[1] == "jobs"] == []  # no build, no lookup
    assert builds_posted(k8s) == [build_name(digest)]
    spec = k8s.stored("configmaps", "team-a", "fit2-spec")["data"]["job.yaml"]
    assert f"image: {first.json()['image']}" in spec  # the pods run the image built first
    assert k8s.stored("configmaps", "team-a", "fit2-package") is None


async def test_another_base_image_or_registry_builds_again(k8s, api_client, tmp_path):
    config = build_config(tmp_path)
    other_base = "paddlecloud/paddlecloud:0.2.0"
    async with server(api_client, tmp_path, build=config) as client:
        digest = await upload(client)
        first = await submit_and_build(k8s, client, {**JOB, "trainer_package": digest},
                                       build_name(digest))
        other = await submit_and_build(
            k8s, client, {**JOB, "job_name": "fit2", "trainer_package": digest,
                          "base_image": other_base}, build_name(digest, other_base))
    assert first.status_code == other.status_code == 201, (first.text, other.text)
    assert other.json()["image"] != first.json()["image"]
    assert builds_posted(k8s) == [build_name(digest), build_name(digest, other_base)]
    await delete_build_job(api_client, build_name(digest))
    moved = dataclasses.replace(config, registry="registry.example.com/moved")
    async with server(api_client, tmp_path, build=moved) as client:  # the record names the old one
        third = await submit_and_build(k8s, client, {**JOB, "job_name": "fit3",
                                                     "trainer_package": digest}, build_name(digest))
    assert third.status_code == 201, third.text
    assert third.json()["image"].startswith("registry.example.com/moved/runtime:")
    assert builds_posted(k8s)[-1] == build_name(digest)


async def test_a_failed_build_is_not_recorded(k8s, api_client, tmp_path):
    async with server(api_client, tmp_path, build=build_config(tmp_path)) as client:
        digest = await upload(client)
        submit = asyncio.create_task(client.post("/v1/trainer/job", headers=A,
                                                 json={**JOB, "trainer_package": digest}))
        await k8s.wait_for(lambda: k8s.stored("jobs", "builds", build_name(digest)),
                           what="the build Job")
        k8s.set_job_status("builds", build_name(digest), {"failed": 1})
        assert (await submit).status_code == 422
    store = PackageStore(str(tmp_path / "store"))
    assert store.recorded_image(image_build.image_tag(digest, BASE)) is None


def test_the_sdk_waits_longer_for_a_submit_than_the_server_for_a_build():
    assert sdk.SUBMIT_TIMEOUT_S > image_build.MAX_BUILD_TIMEOUT_S >= image_build.BuildConfig.timeout_s


@pytest.mark.parametrize(("value", "named"), [(7200, "7200"), (0, "0"), ("slow", "'slow'")])
def test_a_build_timeout_the_sdk_would_not_wait_for_is_refused_naming_it(tmp_path, value, named):
    path = tmp_path / "server.yaml"
    path.write_text(f"build: {{registry: r.example.com/pc, namespace: builds, timeout_s: {value}}}\n")
    with pytest.raises(ConfigError, match=rf"config key build: build timeout_s {named} must be"):
        load_config(str(path))
