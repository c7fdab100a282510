"""The status page's JSON, without a browser: against real masters on a real etcd, with
stub trainers, checked against the schema the master publishes at /api/schema."""

from __future__ import annotations

import time

import aiohttp
import grpc
import jsonschema
import pytest
from datasets import write_records
from masters import stub, wait_for, wait_serving

from master.presence import read_masters
from master.web import StatusPage
from paddlecloud import etcd, pagestyle
from paddlecloud.api import pb
from paddlecloud.etcd_server import free_port, free_ports
from paddlecloud.keys import JobKeys


async def get(url: str, *, token: str | None = None, status: int = 200) -> dict | str:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as reply:
        assert reply.status == status, f"{url}: {reply.status} {await reply.text()}"
        if reply.content_type == "application/json":
            return await reply.json()
        return await reply.text()


async def checked(base: str, schema: dict, part: str) -> dict:
    """GET /api/<part>, validated against the published schema."""
    document = await get(f"{base}/api/{part}")
    jsonschema.validate(document, schema[part])
    return document


async def test_the_json_follows_a_job_to_its_end_and_matches_its_schema(tmp_path, start_master,
                                                                        start_trainer):
    write_records(tmp_path / "data", files=4, records_per_file=20)
    page_port = free_port()
    master = start_master("--input", str(tmp_path / "data"), "--chunk-bytes", "200", "--epochs", "2",
                          "--metrics-port", str(page_port))
    await wait_serving(master.address, process=master)
    base = f"http://127.0.0.1:{page_port}"
    schema = await get(f"{base}/api/schema")
    job = await checked(base, schema, "job")
    assert job["role"] == "leader" and job["leader"] == master.address
    assert [e["stage"] for e in job["epochs"]] == ["current", "future"]
    assert job["epochs"][0]["todo"] == job["num_tasks"] > 1
    for i in ("0", "1"):
        start_trainer(i, log=tmp_path / "records.tsv", master=master.address,
                      args=("--delay", "0.02"))

    async def two_trainers_listed() -> dict | None:
        job = await checked(base, schema, "job")
        return job if [t["trainer"] for t in job["trainers"]] == ["0", "1"] else None

    job = await wait_for(two_trainers_listed, timeout=60, message="trainers not listed",
                         details=master.log)
    assert all(t["session"].isdigit() for t in job["trainers"])  # no tokens: an operator sees them

    async def ended() -> dict | None:
        job = await checked(base, schema, "job")
        return job if job["phase"] == "Succeeded" else None

    job = await wait_for(ended, timeout=120, message="the job did not succeed", details=master.log)
    assert [(e["stage"], e["done"], e["failed"]) for e in job["epochs"]] == [("past", job["num_tasks"], 0)] * 2
    assert job["finished_total"] == 2 * job["num_tasks"]

    async def sampled() -> dict | None:
        series = await checked(base, schema, "series")
        return series if sum(series["finished_per_s"]) == 2 * job["num_tasks"] else None

    series = await wait_for(sampled, timeout=10, message="the series missed finished tasks")
    assert len(series["trainers_alive"]) == len(series["finished_per_s"]) >= 2
    assert max(series["trainers_alive"]) == 2
    text = await get(f"{base}/metrics")
    assert f"paddlecloud_master_finishes_total {float(2 * job['num_tasks'])}" in text
    # goodput: the job's figures, worded as `job status` words them, and their history
    assert job["goodput"]["summary"].startswith("goodput: ")
    assert job["goodput"]["trainer_seconds"]["productive"] > 0
    assert 0 < job["goodput"]["productive_percent"] <= 100

    async def history() -> dict | None:
        found = await checked(base, schema, "goodput")
        return found if len(found["at"]) >= 2 else None

    found = await wait_for(history, timeout=30, message="no goodput history")
    assert found["causes"][0] == "productive" and set(found["seconds"]) == set(found["causes"])
    assert all(len(values) == len(found["at"]) for values in found["seconds"].values())
    assert found["seconds"]["productive"][-1] > 0


async def test_a_failed_job_says_why_and_shows_each_failed_task_s_last_reasons(tmp_path, start_master,
                                                                            start_trainer):
    data = tmp_path / "data"
    data.mkdir()
    for f in range(2):  # every record poisoned: the stub trainer fails each task it reads
        (data / f"part-{f}.csv").write_text("".join(f"{f}-{i},POISON <b>&</b>\n" for i in range(5)))
    page_port = free_port()
    master = start_master("--input", str(data), "--chunk-bytes", "100",
                          "--max-task-failures", "1", "--metrics-port", str(page_port))
    await wait_serving(master.address, process=master)
    base = f"http://127.0.0.1:{page_port}"
    schema = await get(f"{base}/api/schema")
    start_trainer("0", log=tmp_path / "records.tsv", master=master.address)

    async def failed() -> dict | None:
        job = await checked(base, schema, "job")
        return job if job["phase"] == "Failed" else None

    job = await wait_for(failed, timeout=90, message="the job did not fail", details=master.log)
    assert "every task of epoch 0 failed" in job["failure_reason"]
    assert {t["task"] for t in job["failed_tasks"]} == set(range(job["num_tasks"]))
    for task in job["failed_tasks"]:
        assert task["status"] == "failed" and task["failures"] >= 1
        assert task["reasons"] and "poisoned record" in task["reasons"][-1]["reason"]
        assert "<b>&</b>" in task["reasons"][-1]["reason"]  # kept as given: the page escapes it
        assert task["reasons"][-1]["trainer"] == "0"


async def test_a_resize_raises_the_series_and_the_metric_a_refused_or_unchanged_size_does_not(
        start_master):
    page_port = free_port()
    master = start_master("--trainers", "2", "--min-trainers", "1", "--max-trainers", "4",
                          "--metrics-port", str(page_port))
    await wait_serving(master.address, process=master)
    base = f"http://127.0.0.1:{page_port}"
    schema = await get(f"{base}/api/schema")

    async def resizes_in_a_later_sample() -> float:
        """The resizes in the series, once it holds a sample taken after every call so far."""
        calls_done = time.time()

        async def sampled() -> dict | None:
            series = await checked(base, schema, "series")
            return series if series["end"] > calls_done else None

        return sum((await wait_for(sampled, timeout=10, message="no new sample"))["resizes"])

    async with grpc.aio.insecure_channel(master.address) as channel:
        scale = stub(channel).ScaleTrainers
        await scale(pb.ScaleTrainersRequest(trainers=3))
        assert await resizes_in_a_later_sample() == 1
        await scale(pb.ScaleTrainersRequest(trainers=3))  # unchanged
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await scale(pb.ScaleTrainersRequest(trainers=9))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert await resizes_in_a_later_sample() == 1
        await scale(pb.ScaleTrainersRequest(trainers=1))
        assert await resizes_in_a_later_sample() == 2
    text = await get(f"{base}/metrics")
    assert 'paddlecloud_master_resizes_total{direction="up"} 1.0' in text
    assert 'paddlecloud_master_resizes_total{direction="down"} 1.0' in text


async def test_every_master_s_page_lists_leader_and_standby_and_a_dead_one_goes(
        start_master, etcd_endpoint, job_name):
    ports = free_ports(2)
    ttl = ("--election-ttl", "2s")
    first = start_master(*ttl, "--metrics-port", str(ports[0]), name="first")
    await wait_serving(first.address, process=first)
    second = start_master(*ttl, "--metrics-port", str(ports[1]), name="second")
    expected = [(first.address, "leader", f"http://127.0.0.1:{ports[0]}/"),
                (second.address, "standby", f"http://127.0.0.1:{ports[1]}/")]

    def listed(job: dict) -> list[tuple[str, str, str]]:
        return sorted((m["advertise"], m["role"], m["page"]) for m in job["masters"])

    for port, me in zip(ports, (first.address, second.address), strict=True):
        base = f"http://127.0.0.1:{port}"
        schema = await get(f"{base}/api/schema")

        async def both(base=base, schema=schema) -> dict | None:
            try:
                job = await checked(base, schema, "job")
            except aiohttp.ClientConnectorError:  # the second's page is not up yet
                return None
            return job if listed(job) == sorted(expected) else None

        job = await wait_for(both, timeout=30, message=f"{me}'s page does not list both masters",
                             details=lambda: first.log() + second.log())
        assert [m["advertise"] for m in job["masters"] if m["this"]] == [me]
        assert all(0 < time.time() - m["started"] < 120 for m in job["masters"])
    # readiness (the pod's probe): the leader only, and no token asked
    assert await get(f"http://127.0.0.1:{ports[0]}/ready") == "serving\n"
    assert "not serving" in await get(f"http://127.0.0.1:{ports[1]}/ready", status=503)

    # A standby whose session is lost announces itself again on its next session's lease.
    client = await etcd.connect(etcd_endpoint)
    try:
        key = JobKeys("local", job_name).master(second.address)
        lease = (await client.get(key)).lease
        await client.revoke_lease(lease)

        async def back_on_a_new_lease() -> bool:
            found = await client.get(key)
            return found is not None and found.lease != lease

        await wait_for(back_on_a_new_lease, timeout=30, message="the standby did not announce itself again",
                       details=second.log)
    finally:
        await client.close()

    second.kill()

    async def only_the_leader() -> bool:
        job = await get(f"http://127.0.0.1:{ports[0]}/api/job")
        return listed(job) == expected[:1]

    await wait_for(only_the_leader, timeout=30, message="the killed standby is still listed",
                   details=first.log)


async def test_a_page_whose_etcd_does_not_answer_lists_no_masters_and_still_answers():
    async def unreachable():
        raise etcd.EtcdUnavailable("etcd unreachable at nowhere")

    page = StatusPage(job="j", namespace="local", advertise="a:1", dispatcher=lambda: None,
                      leader_hint=lambda: "b:2", masters=unreachable)
    await page.start(host="127.0.0.1", port=0)
    try:
        job = await get(f"http://127.0.0.1:{page.port}/api/job")
        assert job["masters"] == [] and job["leader"] == "b:2"
    finally:
        await page.stop()


@pytest.fixture
async def guarded_page(leader, job_name):
    page = StatusPage(job=job_name, namespace="local", advertise="me:1", dispatcher=lambda: leader,
                      leader_hint=lambda: None,
                      masters=lambda: read_masters(leader.store.client, JobKeys("local", job_name)),
                      tokens={"v-token": "viewer", "o-token": "operator", "t-token": "trainer"})
    await page.start(host="127.0.0.1", port=0)
    yield page, f"http://127.0.0.1:{page.port}"
    await page.stop()


async def test_every_data_request_needs_a_viewer_or_operator_token(guarded_page):
    _, base = guarded_page
    for path in ("/api/job", "/api/series", "/metrics"):
        await get(base + path, status=401)
        await get(base + path, token="wrong", status=401)
        await get(base + path, token="t-token", status=403)
        await get(base + path, token="v-token")
        await get(base + path, token="o-token")
    await get(base + "/api/job?token=v-token")
    # The page's shell, code and schema carry no job data: open.
    assert "<title>" in await get(base + "/")
    await get(base + "/static/page.js")
    assert await get(base + "/static/page.css") == pagestyle.stylesheet()  # the core's, not in master/static
    await get(base + "/api/schema")
    await get(base + "/ready", status=503)  # readiness, open: this page was given no serving state


async def test_a_viewer_sees_no_session_ids_and_a_new_session_counts_as_a_restart(guarded_page, leader):
    page, base = guarded_page
    first = await leader.trainers.register("t0")

    async def listed(token: str) -> dict | None:
        job = await get(f"{base}/api/job", token=token)
        return job if job["trainers"] else None

    operator = await wait_for(lambda: listed("o-token"), timeout=10)
    assert operator["trainers"][0]["session"] == str(first.session)
    viewer = await wait_for(lambda: listed("v-token"), timeout=10)
    assert viewer["viewer_role"] == "viewer" and "session" not in viewer["trainers"][0]
    assert [(m["advertise"], m["role"], m["this"]) for m in viewer["masters"]] == [("me:1", "leader", True)]
    assert str(first.session) not in str(viewer)
    await wait_for(lambda: page.recorder.sessions.get("t0") == first.session, timeout=10)
    await leader.trainers.register("t0")  # the same id again: a restarted trainer

    async def restarted() -> bool:
        job = await get(f"{base}/api/job", token="o-token")
        return job["trainers"][0]["restarts"] == 1

    await wait_for(restarted, timeout=10, message="the new session was not counted as a restart")


async def test_past_its_limit_the_page_lists_the_trainers_longest_since_their_last_call(leader, job_name):
    page = StatusPage(job=job_name, namespace="local", advertise="me:1", dispatcher=lambda: leader,
                      leader_hint=lambda: None, trainers_shown=3)
    await page.start(host="127.0.0.1", port=0)
    try:
        base = f"http://127.0.0.1:{page.port}"
        schema = await get(f"{base}/api/schema")
        sessions = {t: (await leader.trainers.register(t)).session for t in ("t0", "t1", "t2", "t3", "t4")}
        job = await checked(base, schema, "job")
        assert [t["trainer"] for t in job["trainers"]] == ["t0", "t1", "t2"]  # registered in this order
        assert job["trainers_omitted"] == 2 and job["trainers_alive"] == 5
        for trainer in ("t1", "t3", "t0", "t4"):  # t2 is left the longest without a call
            await leader.trainers.keep_alive(sessions[trainer])
        job = await checked(base, schema, "job")
        assert [t["trainer"] for t in job["trainers"]] == ["t2", "t1", "t3"]
        assert job["trainers_omitted"] == 2
        await wait_for(lambda: page.recorder.sessions.get("t4") == sessions["t4"], timeout=10)
        await leader.trainers.register("t4")  # a restart of a trainer the page does not list

        async def counted() -> dict | None:
            job = await checked(base, schema, "job")
            return job if job["trainer_restarts"] == 1 else None

        job = await wait_for(counted, timeout=10, message="the unlisted trainer's restart was not counted")
        assert "t4" not in [t["trainer"] for t in job["trainers"]]
        page.trainers_shown = 5
        job = await checked(base, schema, "job")
        assert [t["trainer"] for t in job["trainers"]] == ["t0", "t1", "t2", "t3", "t4"]  # all fit: id order
        assert job["trainers_omitted"] == 0
    finally:
        await page.stop()


async def test_the_page_listens_only_on_the_master_s_host():
    page = StatusPage(job="j", namespace="local", advertise="a:1", dispatcher=lambda: None,
                      leader_hint=lambda: "b:2")
    await page.start(host="127.0.0.2", port=0)
    try:
        job = await get(f"http://127.0.0.2:{page.port}/api/job")
        assert job["role"] == "standby" and job["leader"] == "b:2" and job["phase"] == "Standby"
        with pytest.raises(aiohttp.ClientConnectorError):
            await get(f"http://127.0.0.1:{page.port}/api/job")
    finally:
        await page.stop()
