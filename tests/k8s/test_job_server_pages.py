"""The Job Server's browser pages: `/` lists the token's jobs, and each job's status page
comes through the Job Server from a REAL master (on a real etcd, with the tokens of the
Secret the Job Server made at submit), the Kubernetes side played by kmock."""

from __future__ import annotations

import asyncio
import base64
import re
from typing import Any

import aiohttp
import httpx2
import pytest
import uvicorn
from browser import chromium_page, require_browser
from conftest import RESOURCES
from datasets import write_records
from masters import wait_for, wait_serving

from job_server.app import create_app
from job_server.config import ServerConfig
from paddlecloud.aio import cancel_and_wait
from paddlecloud.auth import JobTokens
from paddlecloud.backends.k8s import manifests
from paddlecloud.etcd_server import free_port, free_ports

TOKENS = {"token-a": ("team-a",), "token-b": ("team-b",), "token-ab": ("team-a", "team-b")}
A = {"Authorization": "Bearer token-a"}
B = {"Authorization": "Bearer token-b"}
JOB = {"module": "fit.train", "trainers": 1, "memory": "1Gi", "cpu_num": 1, "epochs": 2}
PAGE = "/v1/namespaces/team-a/jobs/fit/page/"


class Jobs:
    """Three jobs in kmock — team-a/fit (its real master answers), team-a/idle (no master
    answers), team-b/other — and the Job Server's client."""

    def __init__(self, app: Any, client: httpx2.AsyncClient, *, master_base: str, tokens: JobTokens) -> None:
        self.app, self.client, self.master_base, self.tokens = app, client, master_base, tokens

    async def master_json(self, path: str, role: str = "viewer") -> Any:
        """The master's own answer, asked directly with the job's token of `role`."""
        headers = {"Authorization": f"Bearer {getattr(self.tokens, role)}"}
        async with aiohttp.ClientSession() as http, http.get(self.master_base + path, headers=headers) as reply:
            assert reply.status == 200, await reply.text()
            return await reply.json()

    async def master_bytes(self, path: str) -> bytes:
        async with aiohttp.ClientSession() as http, http.get(self.master_base + path) as reply:
            assert reply.status == 200
            return await reply.read()


def submitted_tokens(k8s: Any, namespace: str, name: str) -> JobTokens:
    """The tokens of the Secret `NAME-tokens` the Job Server created at submit."""
    data = k8s.stored("secrets", namespace, manifests.tokens_secret_name(name))["data"]
    return JobTokens(**{role: base64.b64decode(data[role]).decode() for role in ("trainer", "operator", "viewer")})


@pytest.fixture
async def jobs(k8s, api_client, tmp_path, start_master, start_trainer):
    page_port, nobody = free_ports(2)  # nothing listens on `nobody`
    addresses = {("team-a", "fit"): f"127.0.0.1:{page_port}"}
    app = create_app(ServerConfig(store=str(tmp_path / "store"), tokens=TOKENS), api_client=api_client,
                     page_address=lambda ns, name: addresses.get((ns, name), f"127.0.0.1:{nobody}"))
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://server") as client:
        for name, headers in (("fit", A), ("idle", A), ("other", B)):
            reply = await client.post("/v1/trainer/job", headers=headers, json={**JOB, "job_name": name})
            assert reply.status_code == 201, reply.text
        deployment = k8s.kmock.objects[RESOURCES["deployments"], "team-a", "fit-master"]
        deployment.patch({"metadata": {"annotations": {manifests.PHASE_ANNOTATION: "Running"}}})
        tokens = submitted_tokens(k8s, "team-a", "fit")
        tokens.write(tmp_path / "tokens")
        write_records(tmp_path / "data", files=8, records_per_file=20)
        master = start_master("--input", str(tmp_path / "data"), "--chunk-bytes", "200", "--epochs", "2",
                              "--tokens-dir", str(tmp_path / "tokens"), "--metrics-port", str(page_port))
        await wait_serving(master.address, process=master)
        # one trainer, slow enough that the job runs through the test: a session to hide
        start_trainer("0", log=tmp_path / "records.tsv", master=master.address, args=("--delay", "0.5"),
                      env={"PADDLE_JOB_TOKEN_FILE": str(tmp_path / "tokens" / "trainer")})
        found = Jobs(app, client, master_base=f"http://127.0.0.1:{page_port}", tokens=tokens)

        async def trainer_listed() -> bool:
            return bool((await found.master_json("/api/job", role="operator"))["trainers"])

        await wait_for(trainer_listed, timeout=30, message="the trainer never registered", details=master.log)
        yield found


def rows(page: str) -> dict[str, str]:
    """The overview's rows by `namespace/name`."""
    return dict(re.findall(r'<tr data-job="([^"]+)">(.*?)</tr>', page))


def field(row: str, name: str) -> str:
    found = re.search(rf'data-field="{name}">([^<]*)<', row)
    assert found, (name, row)
    return found.group(1)


async def test_the_overview_lists_exactly_the_jobs_of_the_tokens_namespaces(jobs):
    client = jobs.client

    async def with_progress() -> dict[str, str] | None:
        """The overview's rows once the running master answered it in time (a master slower
        than OVERVIEW_TIMEOUT_S shows "-": a loaded box's first call can be)."""
        listed = rows((await client.get("/", headers=A)).text)
        return listed if 'data-field="epoch"' in listed.get("team-a/fit", "") else None

    listed = await wait_for(with_progress, timeout=60, interval=0.5, message="no progress in the overview")
    assert sorted(listed) == ["team-a/fit", "team-a/idle"]
    own = await jobs.master_json("/api/job")
    fit = listed["team-a/fit"]
    assert field(fit, "phase") == "Running" and field(listed["team-a/idle"], "phase") == "Pending"
    assert field(fit, "epoch") == f"{own['epoch']} of 0..1"  # from 0, as everywhere
    assert re.search(rf'data-field="tasks">.*</span> / {own["num_tasks"]} ', fit), fit
    assert field(fit, "alive") == "1"
    assert f'<a href="{PAGE[1:]}">fit</a>' in fit  # a relative link
    assert "data-field" not in listed["team-a/idle"].replace('data-field="phase"', "")  # no master: no progress
    assert sorted(rows((await client.get("/", headers=B)).text)) == ["team-b/other"]
    both = (await client.get("/", headers={"Authorization": "Bearer token-ab"})).text
    assert sorted(rows(both)) == ["team-a/fit", "team-a/idle", "team-b/other"]
    assert (await client.get("/")).status_code == 401
    assert (await client.get("/", headers={"Authorization": "Bearer nope"})).status_code == 401


async def test_the_proxied_page_and_its_json_are_the_masters_own_as_a_viewer_sees_them(jobs):
    client = jobs.client
    for path in ("", "static/page.js", "static/page.css", "api/schema"):
        reply = await client.get(PAGE + path, headers=A)
        assert reply.status_code == 200, (path, reply.text)
        assert reply.content == await jobs.master_bytes("/" + path), path
    assert (await client.get(PAGE + "api/schema", headers=A)).json() == await jobs.master_json("/api/schema")
    through = (await client.get(PAGE + "api/job", headers=A)).json()
    own = await jobs.master_json("/api/job")
    stable = ("job", "namespace", "this_master", "role", "leader", "phase", "num_epochs", "num_tasks")
    assert {k: through[k] for k in stable} == {k: own[k] for k in stable}
    assert through.keys() == own.keys()
    assert through["viewer_role"] == "viewer"
    assert [t["trainer"] for t in through["trainers"]] == ["0"]
    assert [t.get("session") for t in through["trainers"]] == [None]  # a viewer sees no session ids
    series = (await client.get(PAGE + "api/series", headers=A)).json()
    assert series.keys() == (await jobs.master_json("/api/series")).keys()
    goodput = (await client.get(PAGE + "api/goodput", headers=A)).json()
    assert goodput["causes"] == (await jobs.master_json("/api/goodput"))["causes"]
    # the master's own security headers come through, the Job Server's policy beside them
    shell = await client.get(PAGE, headers=A)
    async with aiohttp.ClientSession() as http, http.get(jobs.master_base + "/") as direct:
        own_policy = direct.headers["Content-Security-Policy"]
    assert own_policy in shell.headers.get_list("content-security-policy")
    assert len(shell.headers.get_list("content-security-policy")) == 2
    assert shell.headers["x-frame-options"] == "DENY"
    # the page's URLs are relative, so they resolve under the prefix
    assert 'src="static/page.js"' in (await client.get(PAGE, headers=A)).text
    redirect = await client.get(PAGE.rstrip("/"), headers=A)
    assert redirect.status_code == 308 and redirect.headers["location"] == PAGE


async def test_a_job_outside_the_tokens_namespaces_is_not_found_like_a_missing_one(jobs):
    client = jobs.client
    refused = await client.get(PAGE + "api/job", headers=B)
    missing = await client.get("/v1/namespaces/team-a/jobs/nope/page/api/job", headers=A)
    assert refused.status_code == missing.status_code == 404
    assert refused.json()["detail"] == "job fit not found in namespace team-a"
    assert missing.json()["detail"] == "job nope not found in namespace team-a"
    assert (await client.get("/v1/namespaces/team-b/jobs/other/page/", headers=A)).status_code == 404
    assert (await client.get(PAGE + "api/job")).status_code == 401
    # a job of the token's namespaces whose master does not answer: the gateway says so
    idle = await client.get("/v1/namespaces/team-a/jobs/idle/page/api/job", headers=A)
    assert idle.status_code == 502 and "did not answer" in idle.json()["detail"]


async def test_paths_outside_the_page_are_refused(jobs):
    for path in ("metrics", "static/..%2F..%2Fmetrics", "api/jobs", "static/page.js/x",
                 "static/.hidden.js", "api", "api/job/", "static/"):
        reply = await jobs.client.get(PAGE + path, headers=A)
        assert reply.status_code == 404, (path, reply.status_code)
        assert "is not a path of the status page" in reply.json()["detail"], path
    # dot segments: the client resolves them away before they reach the Job Server
    reply = await jobs.client.get(PAGE + "api/job/../../metrics", headers=A)
    assert reply.status_code == 404 and "paddlecloud_" not in reply.text  # no Prometheus text


async def test_a_token_given_once_becomes_a_strict_httponly_cookie_and_leaves_the_address(jobs):
    client = jobs.client
    reply = await client.get("/?token=token-a")
    assert reply.status_code == 303 and reply.headers["location"] == "/"
    cookie = reply.headers["set-cookie"]
    assert cookie.startswith("paddlecloud_token=token-a;")
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    assert sorted(rows((await client.get("/")).text)) == ["team-a/fit", "team-a/idle"]  # the cookie's
    assert (await client.get(PAGE + "api/job")).json()["viewer_role"] == "viewer"
    moved = await client.get(PAGE + "?token=token-b")
    assert moved.status_code == 303 and moved.headers["location"] == PAGE
    assert (await client.get(PAGE + "api/job")).status_code == 404  # now token-b's cookie
    # the JSON API wants the header: the cookie acts on nothing there
    assert (await client.get("/v1/jobs")).status_code == 401
    assert (await client.get("/?token=nope")).status_code == 401


async def test_nothing_the_browser_receives_holds_a_master_token_or_a_session_id(jobs):
    client = jobs.client
    sessions = [t["session"] for t in (await jobs.master_json("/api/job", role="operator"))["trainers"]]
    assert sessions and all(sessions)
    secrets = [jobs.tokens.trainer, jobs.tokens.operator, jobs.tokens.viewer, *sessions]
    received = []
    for path in ("/?token=token-a", "/", "/static/page.css", PAGE + "?token=token-a", PAGE,
                 *(PAGE + p for p in ("static/page.js", "static/page.css", "api/job", "api/series",
                                      "api/schema", "metrics"))):
        reply = await client.get(path)
        received.append(reply.text + str(reply.headers))
    assert received and not [s for s in secrets if any(s in r for r in received)]


def browse(base: str) -> dict[str, str]:
    """Opens the overview with the token once, follows the link to team-a/fit: what it draws."""
    with chromium_page(width=1200, height=800) as page:
        page.goto(base + "/?token=token-a")
        overview_url = page.url
        page.get_by_role("link", name="fit", exact=True).click()
        page.get_by_test_id("phase").filter(has_text="Running").wait_for(timeout=30_000)
        page.locator("#trainers tr[data-trainer='0']").wait_for(timeout=30_000)
        return {"overview": overview_url, "page": page.url, "job": page.locator("#job-name").inner_text(),
                "session_column": str(page.locator("th.operator-only").is_visible())}


async def test_a_browser_follows_the_overview_to_the_proxied_page_which_draws(jobs):
    require_browser()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(jobs.app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off"))
    serving = asyncio.create_task(server.serve(), name="job-server-under-test")
    try:
        await wait_for(lambda: server.started, timeout=30, message="the Job Server never started")
        seen = await asyncio.to_thread(browse, f"http://127.0.0.1:{port}")
    finally:
        server.should_exit = True
        await wait_for(serving.done, timeout=30, message="the Job Server never stopped")
        await cancel_and_wait(serving)
    own = await jobs.master_json("/api/job")
    assert seen == {"overview": f"http://127.0.0.1:{port}/", "page": f"http://127.0.0.1:{port}{PAGE}",
                    "job": own["job"], "session_column": "False"}
