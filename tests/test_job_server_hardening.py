"""The Job Server's smaller defences (issue 34): packages that would shadow paddlecloud's modules,
etcd endpoints a submitter chooses, quotas on by default, the cookie's Secure flag behind TLS,
and `/docs` served from the package with no external host."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import uvicorn
import yaml
from browser import chromium_page, require_browser
from click.testing import CliRunner
from fastapi.testclient import TestClient
from masters import wait_for
from test_job_server_packages import zip_of

from job_server.app import create_app
from job_server.config import ConfigError, ServerConfig, load_config
from paddlecloud.aio import cancel_and_wait
from paddlecloud.cli.jobs import job
from paddlecloud.etcd_server import free_port
from paddlecloud.package_names import RESERVED_MODULES

REPO = Path(__file__).resolve().parents[1]
TOKEN = {"Authorization": "Bearer token-a"}
JOB = {"job_name": "fit", "module": "fit.train"}


def tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.yaml"
    path.write_text("token-a: [team-a]\n")
    return path


def client_of(**config) -> TestClient:
    app = create_app(ServerConfig(store="memory://hardening", tokens={"token-a": ("team-a",)},
                                  **config), api_client=None)  # every refusal comes before the API
    return TestClient(app)


# ---- a package never shadows paddlecloud ---------------------------------------------------
@pytest.mark.unit
def test_the_reserved_names_are_exactly_paddlecloud_s_top_level_packages():
    found = re.search(r"include = \[([^\]]*)\]", (REPO / "pyproject.toml").read_text()).group(1)
    assert {name.strip(' "*') for name in found.split(",")} == RESERVED_MODULES


@pytest.mark.parametrize("entry", ["master/__init__.py", "paddlecloud.py", "pkg/trainer_agent/x.py",
                                   "job_server.cpython-311-x86_64-linux-gnu.so"])
@pytest.mark.unit
def test_an_upload_that_would_shadow_paddlecloud_is_refused_naming_the_entry(entry):
    shadowed = entry.removeprefix("pkg/")  # one top folder is stripped: what is left counts
    with client_of() as client:
        files = {"requirements.txt": b"", "fit/train.py": b"", entry: b"x"}
        if entry.startswith("pkg/"):
            files = {f"pkg/{k}": v for k, v in files.items() if not k.startswith("pkg/")} | {entry: b"x"}
        response = client.post("/v1/package", headers=TOKEN, files={"file": ("p.zip", zip_of(files))})
    assert response.status_code == 422, response.text
    assert f"package entry {shadowed!r} would shadow paddlecloud's module" in response.json()["detail"]


@pytest.mark.unit
def test_job_submit_refuses_a_package_path_that_would_shadow_paddlecloud(tmp_path):
    (tmp_path / "fit").mkdir()
    (tmp_path / "fit" / "train.py").write_text("print(1)\n")
    (tmp_path / "master").mkdir()
    (tmp_path / "master" / "__init__.py").write_text("print('not the master')\n")
    result = CliRunner().invoke(job, ["submit", "fit", "--module", "fit.train", "--package-path",
                                      str(tmp_path), "--dry-run"])
    assert result.exit_code != 0
    assert "package entry 'master/__init__.py' would shadow paddlecloud's module 'master'" in result.output
    (tmp_path / "master" / "__init__.py").unlink()
    (tmp_path / "master").rmdir()
    assert CliRunner().invoke(job, ["submit", "fit", "--module", "fit.train", "--package-path",
                                    str(tmp_path), "--dry-run"]).exit_code == 0


@pytest.mark.unit
def test_the_shipped_server_pins_its_own_image_as_the_masters(tmp_path):
    documents = list(yaml.safe_load_all((REPO / "deploy" / "components" / "job-server" / "job-server.yaml").read_text()))
    config_map = next(d for d in documents if d["kind"] == "ConfigMap"
                      and "config.yaml" in d.get("data", {}))
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    (tmp_path / "config.yaml").write_text(config_map["data"]["config.yaml"])
    config = load_config(str(tmp_path / "config.yaml"), tokens_file=str(tokens_file(tmp_path)))
    server_image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert config.paddlecloud_image == server_image


# ---- etcd endpoints and quotas ------------------------------------------------------------
@pytest.mark.unit
def test_a_job_naming_etcd_endpoints_the_server_does_not_allow_is_refused():
    with client_of() as client:
        response = client.post("/v1/trainer/job", headers=TOKEN,
                               json={**JOB, "etcd_endpoints": "http://10.9.9.9:2379"})
    assert response.status_code == 403, response.text
    assert "etcd_endpoints 'http://10.9.9.9:2379' is not one this server allows" in response.text


@pytest.mark.parametrize(("asked", "says"), [
    ({"trainers": 1_000_000}, "1000000 trainers asked, the limit max_trainers_per_job is 256"),
    ({"use_gpu": True, "gpu_num": 100_000}, "100000 GPUs asked (1 trainers x 100000), the limit "
                                            "max_gpus_per_job is 64"),
], ids=["trainers", "gpus"])
@pytest.mark.unit
def test_the_default_config_has_quotas_on_trainers_and_gpus(tmp_path, asked, says):
    with client_of(quotas=load_config(None).quotas) as client:
        response = client.post("/v1/trainer/job", headers=TOKEN, json={**JOB, **asked})
    assert response.status_code == 403 and says in response.json()["detail"], response.text


@pytest.mark.unit
def test_the_new_settings_load_and_bad_ones_are_refused_naming_the_key(tmp_path):
    path = tmp_path / "server.yaml"
    path.write_text("paddlecloud_image: reg.example/pc:2\netcd_endpoints: [https://a:2379, "
                    "'https://b:2379,https://c:2379']\nbehind_tls_proxy: true\n")
    config = load_config(str(path))
    assert config.paddlecloud_image == "reg.example/pc:2" and config.behind_tls_proxy
    assert config.etcd_endpoints == ("https://a:2379", "https://b:2379,https://c:2379")
    for text, says in (("paddlecloud_image: 'a b'", "paddlecloud_image"), ("etcd_endpoints: []", "etcd_endpoints"),
                       ("behind_tls_proxy: yes please", "behind_tls_proxy")):
        path.write_text(text + "\n")
        with pytest.raises(ConfigError, match=says):
            load_config(str(path))


# ---- the cookie behind TLS --------------------------------------------------------------------
@pytest.mark.parametrize(("base_url", "proxy", "secure"), [
    ("http://server", False, False), ("https://server", False, True), ("http://server", True, True),
], ids=["plain-http", "served-with-tls", "behind-a-tls-proxy"])
@pytest.mark.unit
def test_the_session_cookie_is_secure_whenever_the_browser_speaks_tls(base_url, proxy, secure):
    with client_of(behind_tls_proxy=proxy) as client:
        client.base_url = base_url
        reply = client.get("/?token=token-a", follow_redirects=False)
    assert reply.status_code == 303
    assert ("Secure" in reply.headers["set-cookie"]) is secure, reply.headers["set-cookie"]


# ---- /docs without the internet -----------------------------------------------------------
@pytest.mark.unit
def test_docs_reference_no_external_host_and_its_assets_are_served():
    with client_of() as client:
        page = client.get("/docs")
        assert page.status_code == 200
        assert not re.search(r"(?:https?:)?//[A-Za-z0-9.-]+", page.text), page.text
        assets = re.findall(r"""(?:src|href)=["']?([^"' >]+)""", page.text)
        assert sorted(assets) == ["/docs/assets/favicon-32x32.png", "/docs/assets/swagger-ui-bundle.js",
                                  "/docs/assets/swagger-ui.css"]
        shipped = REPO / "job_server" / "static" / "swagger-ui"
        for url in assets:
            served = client.get(url)
            assert served.status_code == 200 and served.content == (shipped / url.rsplit("/", 1)[1]).read_bytes()
        assert "'/openapi.json'" in page.text and '"validatorUrl": null' in page.text
        assert client.get("/docs/assets/README.md").status_code == 404
        assert client.get("/redoc").status_code == 404  # ReDoc loads from a CDN: not served
        # its own page: its script and its one inline script (by hash) only, never framed
        policy = page.headers["content-security-policy"]
        assert "script-src 'self' 'sha256-" in policy and "'unsafe-inline'" not in policy.split("style-src")[0]
        assert "frame-ancestors 'none'" in policy and page.headers["x-frame-options"] == "DENY"


async def test_a_browser_without_the_internet_draws_docs_from_the_server_alone():
    require_browser()
    port = free_port()
    app = client_of().app
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off"))
    serving = asyncio.create_task(server.serve(), name="job-server-under-test")
    try:
        await wait_for(lambda: server.started, timeout=30, message="the Job Server never started")
        hosts, drawn = await asyncio.to_thread(browse_docs, f"http://127.0.0.1:{port}")
    finally:
        server.should_exit = True
        await wait_for(serving.done, timeout=30, message="the Job Server never stopped")
        await cancel_and_wait(serving)
    assert hosts == {f"127.0.0.1:{port}"}
    assert "/v1/package" in drawn and "/v1/trainer/job" in drawn


def browse_docs(base: str) -> tuple[set[str], str]:
    """Opens /docs with every other host cut off: the hosts asked, and what Swagger UI drew."""
    hosts: set[str] = set()
    with chromium_page(width=1200, height=800) as page:
        def only_the_server(route: Any) -> None:
            host = urlsplit(route.request.url).netloc
            hosts.add(host)
            if route.request.url.startswith(base):
                route.continue_()
            else:
                route.abort()  # as in a cluster without internet access

        page.route("**/*", only_the_server)
        page.goto(base + "/docs")
        page.locator(".opblock-summary-path").first.wait_for(timeout=30_000)
        return hosts, page.locator("#swagger-ui").inner_text()
