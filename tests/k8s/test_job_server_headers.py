"""The Job Server's pages against a master its submitter controls: a fake master (a small
aiohttp server) that sends no security headers, script in its page and no JSON at api/job.
The overview still answers (that job shows "-"), its own pages carry a strict policy, and a
proxied page carries the Job Server's policy beside whatever the master sent."""

from __future__ import annotations

import re

import httpx2
import pytest
from aiohttp import web

from job_server.app import create_app
from job_server.config import ServerConfig
from job_server.master_pages import _figures

TOKENS = {"token-a": ("team-a",)}
A = {"Authorization": "Bearer token-a"}
JOB = {"module": "fit.train", "trainers": 1, "memory": "1Gi", "cpu_num": 1, "epochs": 1}
HONEST_POLICY = "default-src 'none'; script-src 'self'"


async def hostile_master(request: web.Request) -> web.Response:
    if request.path == "/api/job":
        return web.Response(text="<html>not json</html>", content_type="text/html")
    if request.path == "/honest":
        return web.Response(text="ok", headers={"Content-Security-Policy": HONEST_POLICY})
    return web.Response(text="<script>fetch('/v1/jobs')</script>", content_type="text/html")


@pytest.fixture
async def server(k8s, api_client, tmp_path):
    app = web.Application()
    app.router.add_get("/{tail:.*}", hostile_master)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    job_server = create_app(ServerConfig(store=str(tmp_path / "store"), tokens=TOKENS), api_client=api_client,
                            page_address=lambda ns, name: f"127.0.0.1:{port}")
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=job_server),
                                  base_url="http://server") as client:
        reply = await client.post("/v1/trainer/job", headers=A, json={**JOB, "job_name": "evil"})
        assert reply.status_code == 201, reply.text
        yield client
    await runner.cleanup()


async def test_a_master_answering_no_json_is_shown_unavailable_under_a_strict_policy(server):
    reply = await server.get("/", headers=A)
    assert reply.status_code == 200, reply.text
    row = re.search(r'<tr data-job="team-a/evil">(.*?)</tr>', reply.text).group(1)
    assert 'data-field="epoch"' not in row and '<td class="muted">-</td>' in row
    policy = reply.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src" not in policy and "frame-ancestors 'none'" in policy
    assert reply.headers["x-frame-options"] == "DENY"


async def test_a_proxied_page_gets_the_servers_policy_beside_the_masters(server):
    page = "/v1/namespaces/team-a/jobs/evil/page/"
    reply = await server.get(page, headers=A)
    assert reply.status_code == 200
    policies = reply.headers.get_list("content-security-policy")
    assert len(policies) == 1  # the master sent none: the Job Server's alone
    ours = policies[0]
    assert f"script-src server{page}static/" in ours and f"connect-src server{page};" in ours
    assert "frame-ancestors 'none'" in ours and reply.headers["x-frame-options"] == "DENY"


def test_figures_refuse_what_is_no_jobs_counts():
    assert _figures(b"<html>") is None and _figures(b"[1]") is None
    assert _figures(b'{"epoch": "x"}') is None and _figures(b'{"counts": [1]}') is None
    assert _figures(b'{"epoch": 1, "num_epochs": 2, "counts": {"done": 3}, "num_tasks": 4}')["tasks_done"] == 3
