"""The Python API: PaddleJob validated when made; dist_train submits to a real Job Server (uvicorn
on loopback, kmock behind it) when PADDLE_NOTEBOOK=YES, and trains locally otherwise."""

from __future__ import annotations

import asyncio
import contextlib
import io
import threading
from pathlib import Path

import pytest
import uvicorn
import yaml
from click.testing import CliRunner
from conftest import RESOURCES

from job_server.app import create_app
from job_server.config import ServerConfig
from paddlecloud import PaddleJob, dist_train
from paddlecloud.backends.k8s import image_build, manifests
from paddlecloud.cli.jobs import job as job_cli
from paddlecloud.etcd_server import free_port
from paddlecloud.jobspec import JobSpec, JobSpecError
from paddlecloud.sdk import JobHandle, _progress_view, _shows_bar


@pytest.mark.unit
def test_a_bad_value_is_refused_at_construction_naming_it():
    with pytest.raises(JobSpecError, match="'lots'"):
        PaddleJob(job_name="fit", module="fit.train", memory="lots")
    with pytest.raises(JobSpecError, match="'Fit!'"):
        PaddleJob(job_name="Fit!", module="fit.train")


@contextlib.asynccontextmanager
async def serving(k8s, api_client, config: ServerConfig):
    """A real Job Server: uvicorn on loopback in a thread, kmock behind it."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(config, api_client=api_client),
                                           host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        await k8s.wait_for(lambda: server.started, what="uvicorn started")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.to_thread(thread.join, 10)


@pytest.fixture
async def job_server(k8s, api_client, tmp_path, etcd_endpoint):
    # a real etcd for the jobs: a delete clears their keys there (one that cannot answers 503)
    config = ServerConfig(store=str(tmp_path / "store"), tokens={"tok": ("team-a",)},
                          etcd_endpoints=(etcd_endpoint,))
    async with serving(k8s, api_client, config) as url:
        yield url


async def test_dist_train_in_a_notebook_submits_and_the_handle_reads_status(
        k8s, job_server, tmp_path, monkeypatch, capsys):
    package = tmp_path / "fit"
    package.mkdir()
    (package / "train.py").write_text("print('fit')\n")
    monkeypatch.setenv("PADDLE_NOTEBOOK", "YES")
    job = PaddleJob(job_name="fit", module="placeholder", trainer_package=str(package),
                    input=("/data/*.csv",), pservers=1, trainers=2)
    handle = await asyncio.to_thread(dist_train, "train", paddle_job=job, server=job_server,
                                     token="tok")
    assert isinstance(handle, JobHandle) and handle.namespace == "team-a"
    assert k8s.stored("configmaps", "team-a", "fit-package")["data"]["train.py"] == "print('fit')\n"
    status = await asyncio.to_thread(handle.status)
    assert status["name"] == "fit" and status["phase"] == "Pending"
    assert set(status["pods"]) == {"trainer", "pserver", "master"}
    k8s.add_pod(JobSpec(name="fit", namespace="team-a", module="m"), "trainer", "fit-trainer-1-b",
                annotations={manifests.COMPLETION_INDEX_ANNOTATION: "1"})
    k8s.kmock["get /api/v1/namespaces/team-a/pods/fit-trainer-1-b/log"] << b"epoch 0 loss 0.69\n"
    assert await asyncio.to_thread(handle.logs, index=1) == "epoch 0 loss 0.69\n"
    k8s.kmock.objects[RESOURCES["deployments"], "team-a", "fit-master"].patch(
        {"metadata": {"annotations": {manifests.PHASE_ANNOTATION: "Succeeded"}}})
    assert (await asyncio.to_thread(handle.wait, interval=0.05, timeout=30))["phase"] == "Succeeded"
    assert "fit: Succeeded" in capsys.readouterr().out  # plain lines: not a terminal
    assert "deployments/fit-master" in await asyncio.to_thread(handle.delete)


def _console(**kwargs):
    from rich.console import Console

    return Console(file=io.StringIO(), width=100, **kwargs)


@pytest.mark.parametrize(("console", "widgets", "bar"), [
    ({"force_terminal": True}, False, True),  # a terminal
    ({"force_jupyter": True}, True, True),  # a notebook: rich draws the bar in a widget
    ({"force_jupyter": True}, False, False),  # a notebook without ipywidgets: rich only warns
    ({"force_jupyter": False}, True, False),  # a log file or a pipe
])
@pytest.mark.unit
def test_wait_draws_a_bar_in_a_terminal_or_a_notebook_and_plain_lines_elsewhere(
        monkeypatch, console, widgets, bar):
    for variable in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):  # rich's overrides
        monkeypatch.delenv(variable, raising=False)
    assert _shows_bar(_console(**console), widgets=widgets) is bar


@pytest.mark.parametrize(("console", "shown"), [
    ({"force_terminal": True}, ["Running", "50%"]),
    ({"force_terminal": False, "force_jupyter": False},
     ["fit: Running, epoch 0 of 0..1, tasks 2/4\n"]),
])
@pytest.mark.unit
def test_the_progress_view_writes_to_its_console(console, shown):
    out = _console(**console)
    show = _progress_view(out)
    status = {"name": "fit", "phase": "Running",
              "progress": {"epoch": 0, "epochs": 2, "tasks_done": 2, "tasks": 4}}
    show(status)
    show(status)  # unchanged: plain lines do not repeat it
    show(None)
    text = out.file.getvalue()
    assert all(part in text for part in shown), text
    assert text.count("fit: Running") <= 1


async def test_a_submit_that_outlasts_its_timeout_says_the_server_goes_on(k8s, api_client, tmp_path):
    """The submit waits for the image build; one that gives up names what the server still does,
    and the server does it."""
    build = image_build.BuildConfig(registry="registry.example.com/pc", namespace="builds",
                                    context_claim="packages", timeout_s=60, poll_s=0.02)
    config = ServerConfig(store=str(tmp_path / "store"), tokens={"tok": ("team-a",)}, build=build)
    package = tmp_path / "fit"
    package.mkdir()
    (package / "train.py").write_text("print('fit')\n")
    job = PaddleJob(job_name="fit", module="train", trainer_package=str(package))
    async with serving(k8s, api_client, config) as url:
        with pytest.raises(ValueError, match="above 0 seconds, got 0"):
            job.submit(server=url, token="tok", timeout=0)
        with pytest.raises(TimeoutError, match=r"no answer .* in 0.5s; .*create the job"):
            await asyncio.to_thread(job.submit, server=url, token="tok", timeout=0.5)
        builds = [name for resource, name in k8s.posted() if resource == "jobs"]
        assert len(builds) == 1 and k8s.stored("deployments", "team-a", "fit-master") is None
        k8s.set_job_status("builds", builds[0], {"succeeded": 1})
        await k8s.wait_for(lambda: k8s.stored("deployments", "team-a", "fit-master"),
                           what="the job the server created after the client gave up")


async def test_job_submit_with_server_creates_what_job_submit_creates(k8s, job_server, etcd_endpoint):
    flags = ["ctr", "--module", "ctr.train", "--trainers", "3", "--pservers", "1",
             "--input", "/data/*.csv", "--trainer-memory", "4Gi", "--trainer-cpu", "2",
             "--pserver-memory", "4Gi", "--pserver-cpu", "2", "-e", "GLOG_v=1"]
    runner = CliRunner()
    result = await asyncio.to_thread(runner.invoke, job_cli, ["submit", *flags, "--server", job_server,
                                                         "--token", "tok"])
    assert result.exit_code == 0, result.output
    assert "job ctr submitted to namespace team-a" in result.output
    options = {"trainers": 3, "pservers": 1, "inputs": ("/data/*.csv",), "trainer_memory": "4Gi",
               "trainer_cpu": "2", "pserver_memory": "4Gi", "pserver_cpu": "2",
               "env": (("GLOG_v", "1"),)}
    spec = JobSpec(name="ctr", namespace="team-a", module="ctr.train",
                   etcd_endpoints=etcd_endpoint, **options)  # the server's etcd
    expected = manifests.master_deployment(spec)
    assert k8s.stored("deployments", "team-a", "ctr-master")["spec"] == expected["spec"]
    assert k8s.posted() == [("configmaps", "ctr-spec"), ("deployments", "ctr-master"),
                            ("services", "ctr-master"), ("serviceaccounts", "ctr-master"),
                            ("roles", "ctr-master"), ("rolebindings", "ctr-master"),
                            ("secrets", "ctr-tokens"),
                            ("networkpolicies", "ctr-internal"), ("networkpolicies", "ctr-master"),
                            ("networkpolicies", "ctr-job-egress"), ("networkpolicies", "ctr-master-egress"),
                            ("networkpolicies", "ctr-ps-egress")]

    # the server carries every field its API takes (a volume anywhere, the shuffle seed...)
    carried = await asyncio.to_thread(runner.invoke, job_cli, [
        "submit", "vol", "--module", "m", "--data-volume", "c:/d", "--shuffle-seed", "7",
        "--server", job_server, "--token", "tok"])
    assert carried.exit_code == 0, carried.output
    stored = JobSpec.from_yaml(k8s.stored("configmaps", "team-a", "vol-spec")["data"][manifests.SPEC_KEY])
    assert (str(stored.data_volume), stored.shuffle_seed) == ("c:/d", 7)
    # and refuses, naming it and why, what a Job Server caller may not set
    refused = await asyncio.to_thread(runner.invoke, job_cli, [
        "submit", "other", "--module", "m", "--secret-env", "T=creds/token", "--server", job_server,
        "--token", "tok"])
    assert refused.exit_code != 0 and "secret_env (a Job Server caller" in refused.output
    assert ("deployments", "other-master") not in k8s.posted()


def test_dist_train_without_a_notebook_trains_here(tmp_path, monkeypatch):
    monkeypatch.delenv("PADDLE_NOTEBOOK", raising=False)
    data = tmp_path / "data.csv"
    data.write_text("".join(f"{i},{2 * i}\n" for i in range(40)))
    job = PaddleJob(job_name="stub-local", module="placeholder", input=(str(data),),
                    output=str(tmp_path / "out"), trainers=1)
    assert dist_train("trainer_agent.stub", paddle_job=job) == 0
    assert (Path(tmp_path / "out" / "logs") / "trainer-0.log").exists()


@pytest.mark.paddle
def test_dist_train_without_a_notebook_trains_fit_a_line_here(tmp_path, monkeypatch):
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    monkeypatch.delenv("PADDLE_NOTEBOOK", raising=False)
    data = tmp_path / "data"
    subprocess.run([sys.executable, "-m", "examples.fit_a_line.data", str(data), "--shards", "2",
                    "--rows", "400"], cwd=repo, check=True)
    job = PaddleJob(job_name="fit-local", module="placeholder", trainer_package=str(repo),
                    input=tuple(sorted(str(p) for p in data.glob("*.csv"))),
                    output=str(tmp_path / "out"), trainers=1, epochs=2)
    assert dist_train("examples.fit_a_line.train", paddle_job=job) == 0
    assert (tmp_path / "out" / "model" / "model.pdparams").stat().st_size > 0


async def test_submit_without_a_server_creates_the_job_as_job_submit_does(
        k8s, kubeconfig, tmp_path, etcd_endpoint):
    package = tmp_path / "ctr"
    package.mkdir()
    (package / "train.py").write_text("print('training')\n")
    job = PaddleJob(job_name="ctr", module="ctr.train", trainer_package=str(package), trainers=2,
                    pservers=1, input=("/data/*.csv",), namespace="ml", etcd_endpoints=etcd_endpoint)
    handle = await asyncio.to_thread(job.submit, kubeconfig=kubeconfig)
    cli = await asyncio.to_thread(CliRunner().invoke, job_cli, [
        "submit", "ctr", "--module", "ctr.train", "--package-path", str(package), "--trainers", "2",
        "--pservers", "1", "--input", "/data/*.csv", "-n", "ml", "--etcd-endpoints", etcd_endpoint,
        "--dry-run"])
    rendered = [d for d in yaml.safe_load_all(cli.output) if d]
    for made in rendered[:4]:  # what `job submit` creates (the rest is the master's)
        resource = {"ConfigMap": "configmaps", "Deployment": "deployments",
                    "Service": "services"}[made["kind"]]
        stored = k8s.stored(resource, "ml", made["metadata"]["name"])
        assert stored is not None and stored.get("spec") == made.get("spec")
        assert stored.get("data") == made.get("data")
    assert (await asyncio.to_thread(handle.status))["phase"] == "Pending"
    assert "deployments/ctr-master" in await asyncio.to_thread(handle.delete)
