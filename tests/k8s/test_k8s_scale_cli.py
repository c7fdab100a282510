"""`paddlecloud job scale NAME` on its Kubernetes path: the master's CA is the one the job
published on its Deployment, so the CLI reaches its own job's master over TLS and refuses an
impostor on that address. Real TLS and gRPC; the API through kmock; the masters answer
GetStatus and ScaleTrainers only (the master's own ScaleTrainers is tested elsewhere)."""

from __future__ import annotations

import asyncio

from click.testing import CliRunner
from test_autoscaler_tls import NS, tls_masters  # noqa: F401 (a fixture)

from paddlecloud.backends.k8s import manifests
from paddlecloud.cli.jobs import job
from paddlecloud.tls import issue_master_certificate


async def scale(*args: str):
    return await asyncio.to_thread(CliRunner().invoke, job, ["scale", *args], catch_exceptions=False)


async def test_job_scale_trusts_the_ca_the_job_published_and_no_other(
        k8s, kubeconfig, tls_masters, monkeypatch):  # noqa: F811
    monkeypatch.delenv("PADDLE_MASTER_CA_FILE", raising=False)
    start, address = tls_masters
    good = await start("good")
    other = issue_master_certificate(manifests.master_certificate_hosts("bad", NS), job="other")
    impostor = await start("bad", key_pair=(other.key, other.cert))
    result = await scale("good", "-n", NS, "--master", address["good"], "--trainers", "3",
                         "--kubeconfig", kubeconfig, "--timeout", "5")
    assert result.exit_code == 0, result.output
    assert "job good: desired trainers 3 (range 1..4)" in result.output
    assert good.scaled == [3]
    result = await scale("bad", "-n", NS, "--master", address["bad"], "--trainers", "3",
                         "--kubeconfig", kubeconfig, "--timeout", "2")
    assert result.exit_code == 1 and "cannot scale job bad" in result.output
    assert impostor.scaled == []


async def test_job_scale_of_a_job_that_is_not_there_says_so(k8s, kubeconfig, monkeypatch):
    monkeypatch.delenv("PADDLE_MASTER_CA_FILE", raising=False)
    result = await scale("ghost", "-n", NS, "--trainers", "2", "--kubeconfig", kubeconfig)
    assert result.exit_code == 1 and "job ghost not found in namespace ml" in result.output
