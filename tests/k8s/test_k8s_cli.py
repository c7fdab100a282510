"""`paddlecloud job submit/list/status/logs/delete` against an emulated API server.

The CLI loads a kubeconfig that points at kmock and talks to it with the official
client over HTTP; `status` reads a real gRPC server standing in for the master;
`delete` clears a real etcd.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from click.testing import CliRunner, Result

from paddlecloud.api import pb, pb_grpc
from paddlecloud.backends.k8s import manifests
from paddlecloud.cli.jobs import job
from paddlecloud.etcd import connect
from paddlecloud.jobspec import JobSpec
from paddlecloud.keys import JobKeys
from paddlecloud.phase import Phase

REPO = Path(__file__).resolve().parents[2]


async def run(*args: str) -> Result:
    """The CLI in a thread: its blocking client calls must not stall kmock's event loop."""
    runner = CliRunner()
    return await asyncio.to_thread(runner.invoke, job, list(args), catch_exceptions=False)


def submit_args(name: str, kubeconfig: str, *extra: str) -> list[str]:
    return ["submit", name, "--module", "ctr.train", "--trainers", "2", "--pservers", "1",
            "--namespace", "ml", "--kubeconfig", kubeconfig, *extra]


async def test_submit_creates_the_master_its_service_and_the_spec(k8s, kubeconfig, tmp_path):
    package = tmp_path / "ctr"
    package.mkdir()
    (package / "train.py").write_text("print('training')\n")
    result = await run(*submit_args("ctr", kubeconfig, "--package-path", str(package),
                                    "--input", "/data/*.csv", "--data-volume", "ctr-data:/data",
                                    "-e", "GLOG_v=1", "--epochs", "3"))
    assert result.exit_code == 0, result.output
    assert "job ctr submitted to namespace ml" in result.output
    assert k8s.posted() == [("configmaps", "ctr-spec"), ("configmaps", "ctr-package"),
                            ("deployments", "ctr-master"), ("services", "ctr-master"),
                            ("serviceaccounts", "ctr-master"), ("roles", "ctr-master"),
                            ("rolebindings", "ctr-master"), ("secrets", "ctr-tokens"), ("networkpolicies", "ctr-internal"),
                            ("networkpolicies", "ctr-master"),
                            ("networkpolicies", "ctr-job-egress"), ("networkpolicies", "ctr-master-egress"),
                            ("networkpolicies", "ctr-ps-egress")]
    deployment = k8s.stored("deployments", "ml", "ctr-master")
    uid = deployment["metadata"]["uid"]
    owner = manifests.owner_reference("ctr", uid)
    assert k8s.stored("services", "ml", "ctr-master")["metadata"]["ownerReferences"] == [owner]
    for policy in ("ctr-internal", "ctr-master"):
        assert k8s.stored("networkpolicies", "ml", policy)["metadata"]["ownerReferences"] == [owner]
    secret = k8s.stored("secrets", "ml", "ctr-tokens")
    assert secret["metadata"]["ownerReferences"] == [owner]
    tokens = secret["data"]
    assert set(tokens) == {"trainer", "operator", "viewer", "tls.crt", "tls.key", "ca.crt"}
    assert len({tokens[role] for role in ("trainer", "operator", "viewer")}) == 3
    for cm in ("ctr-spec", "ctr-package"):
        assert k8s.stored("configmaps", "ml", cm)["metadata"]["ownerReferences"] == [owner]

    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "ctr-master"  # the job's own account and Role
    for resource in ("serviceaccounts", "roles", "rolebindings"):
        assert k8s.stored(resource, "ml", "ctr-master")["metadata"]["ownerReferences"] == [owner]
    assert k8s.stored("rolebindings", "ml", "ctr-master")["subjects"][0]["name"] == "ctr-master"
    container = pod["containers"][0]
    command = container["command"]
    assert command[:2] == ["paddlecloud", "master"]
    for flag, value in (("--job", "ctr"), ("--namespace", "ml"), ("--deployer", "kubernetes"),
                        ("--input", "/data/*.csv"), ("--epochs", "3"), ("--advertise", "$(POD_IP):8080"),
                        ("--job-spec", "/etc/paddlecloud/job.yaml")):
        assert command[command.index(flag) + 1] == value
    assert command[command.index("--tokens-dir") + 1] == "/var/run/paddlecloud/tokens"
    assert {"name": "job-tokens", "secret": {"secretName": "ctr-tokens", "defaultMode": 0o400}} in pod["volumes"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["PADDLE_JOB_NAME"] == "ctr" and env["PADDLE_NAMESPACE"] == "ml"
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    # the job's own etcd user (optional: made only where etcd runs with auth), its password a file
    assert env["PADDLE_ETCD_USER"] == {"secretKeyRef": {"name": "ctr-etcd", "key": "user", "optional": True}}
    assert env["PADDLE_ETCD_PASSWORD_FILE"] == "/var/run/paddlecloud/etcd-user/password"
    assert "PADDLE_ETCD_PASSWORD" not in env
    # the leader only is ready: /ready on the HTTP port (the kubelet's own gRPC probe speaks no TLS)
    assert container["readinessProbe"] == {"httpGet": {"path": "/ready", "port": "metrics"},
                                           "periodSeconds": 2, "timeoutSeconds": 2, "failureThreshold": 1}
    data_mount = next(m for m in container["volumeMounts"] if m["name"] == "data")
    assert data_mount == {"name": "data", "mountPath": "/data", "readOnly": True}

    spec = JobSpec.from_yaml(k8s.stored("configmaps", "ml", "ctr-spec")["data"]["job.yaml"])
    assert (spec.name, spec.trainers, spec.pservers, spec.epochs) == ("ctr", 2, 1, 3)
    # ./ctr is ctr.train's top package: its files ship under ctr/, where `python -m ctr.train` finds them
    assert spec.env == (("GLOG_v", "1"),) and spec.package_files == ("ctr/train.py",)
    assert k8s.stored("configmaps", "ml", "ctr-package")["data"] == {"ctr__train.py": "print('training')\n"}


async def test_a_name_in_use_is_refused(k8s, kubeconfig):
    assert (await run(*submit_args("twice", kubeconfig))).exit_code == 0
    before = len(k8s.posted())
    again = await run(*submit_args("twice", kubeconfig, "--trainers", "5"))
    assert again.exit_code == 1
    assert "job twice already exists in namespace ml" in again.output
    assert len(k8s.posted()) == before  # it read the spec ConfigMap and stopped there
    spec = JobSpec.from_yaml(k8s.stored("configmaps", "ml", "twice-spec")["data"]["job.yaml"])
    assert spec.trainers == 2  # the first job's spec is untouched


async def test_forbidden_submit_says_what_is_missing_and_leaves_nothing(k8s, kubeconfig):
    k8s.fail("patch", "deployments", status=403, times=10,
             message='deployments.apps is forbidden: User "alice" cannot create resource '
                     '"deployments" in the namespace "ml"')
    result = await run(*submit_args("nope", kubeconfig))
    assert result.exit_code == 1
    assert "forbidden to apply deployments nope-master in namespace ml" in result.output
    assert 'User "alice" cannot create' in result.output
    assert "Ask your cluster's admin" in result.output
    assert k8s.stored("configmaps", "ml", "nope-spec") is None  # rolled back


async def test_submit_a_paddlejob(k8s, kubeconfig):
    example = REPO / "deploy/examples/ctr-wide-deep-ps.yaml"
    result = await run("submit", "-f", str(example), "--input", "/data/*.csv",
                       "--kubeconfig", kubeconfig)
    assert result.exit_code == 0, result.output
    spec = JobSpec.from_yaml(k8s.stored("configmaps", "default", "ctr-wide-deep-spec")["data"]["job.yaml"])
    assert (spec.trainers, spec.pservers, spec.with_gloo) == (3, 2, 1)
    assert spec.worker_template["spec"]["containers"][0]["args"] == ["--batch-size", "512"]
    refused = await run("submit", "-f", str(example), "--trainers", "4", "--kubeconfig", kubeconfig)
    assert refused.exit_code == 1
    assert "--trainers cannot be combined with -f" in refused.output


async def test_list_shows_jobs_and_their_phase(k8s, kubeconfig, api_client):
    for name in ("alpha", "beta"):
        assert (await run(*submit_args(name, kubeconfig))).exit_code == 0
    from paddlecloud.backends.k8s.deployer import KubernetesDeployer

    beta = JobSpec(name="beta", namespace="ml", module="ctr.train")
    await KubernetesDeployer(beta, api_client=api_client).show_phase(Phase.RUNNING)
    result = await run("list", "-n", "ml", "--kubeconfig", kubeconfig)
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line.split()[1] for line in result.output.splitlines()[1:] if line.strip()}
    assert rows == {"alpha": "Pending", "beta": "Running"}
    empty = await run("list", "-n", "nobody-here", "--kubeconfig", kubeconfig)
    assert "no paddlecloud jobs in namespace nobody-here" in empty.output


class FakeMaster(pb_grpc.MasterServicer):
    """A master that answers GetStatus only: what `job status` reads."""

    async def GetStatus(self, request: Any, context: Any) -> Any:
        return pb.GetStatusResponse(
            job="ctr", namespace="ml", phase="Running", leader="10.0.0.7:8080",
            current_epoch=1, num_epochs=3, num_tasks=40, trainers_alive=2,
            counts=pb.TaskCounts(todo=20, pending=2, done=18, failed=0),
            pserver_endpoints=["ctr-ps-0.ctr-ps.ml.svc:36000"], has_dataset=True,
            min_trainers=1, max_trainers=4, desired_trainers=3,
            trainer_seconds=[pb.TrainerSeconds(cause="productive", seconds=300),
                             pb.TrainerSeconds(cause="restart", seconds=100)])


@pytest.fixture
async def fake_master(k8s):
    """Starts a FakeMaster serving the TLS certificate `job submit` stored for job `name`."""
    import base64

    servers = []

    async def start(name: str) -> str:
        data = k8s.stored("secrets", "ml", manifests.tokens_secret_name(name))["data"]
        server = grpc.aio.server()
        pb_grpc.add_MasterServicer_to_server(FakeMaster(), server)
        port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials(
            [(base64.b64decode(data["tls.key"]), base64.b64decode(data["tls.crt"]))]))
        await server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for server in servers:
        await server.stop(None)


async def test_status_shows_phase_pods_and_progress(k8s, kubeconfig, fake_master):
    assert (await run(*submit_args("ctr", kubeconfig))).exit_code == 0
    address = await fake_master("ctr")  # TLS: `status` trusts the CA on the job's Deployment
    spec = JobSpec(name="ctr", namespace="ml", module="ctr.train")
    k8s.add_pod(spec, "trainer", "ctr-trainer-0-abcde")
    k8s.add_pod(spec, "trainer", "ctr-trainer-1-fghij", phase="Pending")
    k8s.add_pod(spec, "pserver", "ctr-ps-0")
    k8s.add_pod(JobSpec(name="other", namespace="ml", module="x"), "trainer", "other-trainer-0-x")
    result = await run("status", "ctr", "-n", "ml", "--kubeconfig", kubeconfig,
                       "--master", address)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "job ctr in namespace ml: phase Pending" in out
    trainer_row = next(line.split() for line in out.splitlines() if line.startswith("trainer"))
    assert trainer_row == ["trainer", "1", "1", "0", "0"]  # the other job's pod is not counted
    pserver_row = next(line.split() for line in out.splitlines() if line.startswith("pserver"))
    assert pserver_row == ["pserver", "0", "1", "0", "0"]
    assert "leader 10.0.0.7:8080" in out
    assert "trainers: desired 3, range 1..4, alive 2" in out
    assert "goodput: 75% productive (300 of 400 trainer-seconds); lost: restart 100s" in out
    assert "epoch 1 of 0..2: tasks 18/40 done (todo 20, pending 2, failed 0)" in out
    assert "━" in out and "45%" in out  # the progress bar


async def test_status_without_a_reachable_master_still_shows_the_pods(k8s, kubeconfig):
    assert (await run(*submit_args("lonely", kubeconfig))).exit_code == 0
    k8s.add_pod(JobSpec(name="lonely", namespace="ml", module="x"), "master", "lonely-master-1")
    result = await run("status", "lonely", "-n", "ml", "--kubeconfig", kubeconfig,
                       "--master", "127.0.0.1:1", "--timeout", "0.5")
    assert result.exit_code == 0, result.output
    assert "master: unreachable at 127.0.0.1:1" in result.output
    assert "port-forward svc/lonely-master 8080" in result.output
    master_row = next(line.split() for line in result.output.splitlines() if line.startswith("master "))
    assert master_row == ["master", "0", "1", "0", "0"]
    missing = await run("status", "ghost", "-n", "ml", "--kubeconfig", kubeconfig)
    assert missing.exit_code == 1 and "job ghost not found in namespace ml" in missing.output


async def test_logs_of_a_trainer_by_its_index(k8s, kubeconfig):
    spec = JobSpec(name="ctr", namespace="ml", module="ctr.train")
    index = manifests.COMPLETION_INDEX_ANNOTATION
    k8s.add_pod(spec, "trainer", "ctr-trainer-0-aaaaa", annotations={index: "0"})
    k8s.add_pod(spec, "trainer", "ctr-trainer-1-bbbbb", annotations={index: "1"})
    k8s.kmock["get /api/v1/namespaces/ml/pods/ctr-trainer-1-bbbbb/log"] << b"epoch 0 loss 0.69\n"
    k8s.kmock["get /api/v1/namespaces/ml/pods/ctr-trainer-0-aaaaa/log"] << b"wrong pod\n"
    result = await run("logs", "ctr", "-n", "ml", "--index", "1", "--kubeconfig", kubeconfig)
    assert result.exit_code == 0, result.output
    assert result.output == "epoch 0 loss 0.69\n"
    missing = await run("logs", "ctr", "-n", "ml", "--role", "pserver", "--kubeconfig", kubeconfig)
    assert missing.exit_code == 1 and "no pserver pod with index 0 for job ctr" in missing.output


async def test_logs_of_the_master_follow_the_leader(k8s, kubeconfig):
    spec = JobSpec(name="ctr", namespace="ml", module="ctr.train")
    k8s.add_pod(spec, "master", "ctr-master-5d8f-aaaaa", ready=False)  # the standby
    k8s.add_pod(spec, "master", "ctr-master-5d8f-bbbbb", ready=True)  # the leader
    follows = []
    k8s.kmock["get /api/v1/namespaces/ml/pods/ctr-master-5d8f-bbbbb/log"] >> follows << (
        b"leader elected\n", b"serving on :8080\n")
    result = await run("logs", "ctr", "-n", "ml", "--role", "master", "-f",
                       "--kubeconfig", kubeconfig)
    assert result.exit_code == 0, result.output
    assert result.output == "leader elected\nserving on :8080\n"
    assert follows[0].params["follow"] == "true"


async def test_delete_removes_the_master_the_configmaps_and_the_etcd_keys(
        k8s, kubeconfig, etcd_endpoint):
    assert (await run(*submit_args("gone", kubeconfig))).exit_code == 0
    client = await connect(etcd_endpoint)
    try:
        keys, neighbour = JobKeys("ml", "gone"), JobKeys("ml", "gone-too")
        await client.put(keys.phase, b"Running")
        await client.put(keys.pserver(0), b"gone-ps-0:36000")
        await client.put(neighbour.phase, b"Running")
        result = await run("delete", "gone", "-n", "ml", "--kubeconfig", kubeconfig,
                           "--etcd-endpoints", etcd_endpoint)
        assert result.exit_code == 0, result.output
        assert "etcd: cleared /paddlecloud/ml/gone/ (2 keys)" in result.output
        assert list(await client.get_prefix(keys.prefix)) == []
        assert (await client.get(neighbour.phase)).value == b"Running"  # a prefix, not a substring
    finally:
        await client.close()
    assert k8s.stored("deployments", "ml", "gone-master") is None
    assert k8s.stored("configmaps", "ml", "gone-spec") is None
    deletes = [r for r in k8s.kmock if str(r.method.value).upper() == "DELETE"]
    assert all(r.data.get("propagationPolicy") == "Background" for r in deletes)
    again = await run("delete", "gone", "-n", "ml", "--kubeconfig", kubeconfig)
    assert again.exit_code == 1 and "job gone not found in namespace ml" in again.output


async def test_a_delete_whose_etcd_does_not_answer_fails_saying_so_and_a_retry_finishes_it(
        k8s, kubeconfig, etcd_endpoint):
    unreachable = "http://127.0.0.1:1"  # the job spec's etcd, not answering
    assert (await run(*submit_args("kept", kubeconfig, "--etcd-endpoints", unreachable))).exit_code == 0
    client = await connect(etcd_endpoint)
    try:
        keys = JobKeys("ml", "kept")
        await client.put(keys.phase, b"Running")
        failed = await run("delete", "kept", "-n", "ml", "--kubeconfig", kubeconfig)
        assert failed.exit_code == 1, failed.output
        assert f"its etcd keys under /paddlecloud/ml/kept/ at {unreachable} could not be cleared" in failed.output
        assert k8s.stored("deployments", "ml", "kept-master") is None
        assert k8s.stored("configmaps", "ml", "kept-spec") is not None  # the retry's way back
        retried = await run("delete", "kept", "-n", "ml", "--kubeconfig", kubeconfig,
                            "--etcd-endpoints", etcd_endpoint)
        assert retried.exit_code == 0, retried.output
        assert "deleted configmaps/kept-spec" in retried.output
        assert (await client.get(keys.phase)) is None
    finally:
        await client.close()


async def test_dry_run_is_stable_valid_yaml_and_touches_nothing(k8s, kubeconfig):
    args = submit_args("dry", kubeconfig, "--input", "/data/*.csv", "--dry-run")
    first, second = await run(*args), await run(*args)
    assert first.exit_code == 0, first.output
    assert first.output == second.output
    docs = list(yaml.safe_load_all(first.output))
    assert [d["kind"] for d in docs] == ["ConfigMap", "Deployment", "Service",
                                         *["NetworkPolicy"] * 5, "ServiceAccount", "Role", "RoleBinding",
                                         "Service",
                                         "StatefulSet", "Job"]
    assert list(k8s.kmock) == []  # not one request


async def test_a_package_too_large_for_a_configmap_is_refused(k8s, kubeconfig, tmp_path):
    (tmp_path / "ctr").mkdir()
    (tmp_path / "ctr" / "train.py").write_text("")
    (tmp_path / "ctr" / "big.bin").write_bytes(bytes(range(256)) * 4096)  # 1 MiB, base64 grows it
    result = await run(*submit_args("big", kubeconfig, "--package-path", str(tmp_path / "ctr")))
    assert result.exit_code == 1
    assert "bake the package into the image" in result.output
    assert list(k8s.kmock) == []


@pytest.mark.parametrize("given", ["job.yaml", "jobs/ctr.yml", "specs/ctr"])
async def test_a_file_given_as_the_name_is_refused_pointing_at_dash_f(k8s, kubeconfig, tmp_path,
                                                                      monkeypatch, given):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "ctr").write_text("kind: PaddleJob\n")
    result = await run(*submit_args(given, kubeconfig))
    assert result.exit_code != 0
    assert f"NAME {given!r} is a file, not a job name" in result.output and "-f" in result.output
    assert list(k8s.kmock) == []


async def test_a_job_named_like_a_file_here_is_still_a_job_name(k8s, kubeconfig, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ctr").write_text("a file that happens to share the job's name\n")
    result = await run(*submit_args("ctr", kubeconfig, "--dry-run"))
    assert result.exit_code == 0, result.output


def test_the_job_group_is_a_paddlecloud_subcommand():
    from paddlecloud.cli.main import main

    result = CliRunner().invoke(main, ["job", "--help"])
    assert result.exit_code == 0
    for command in ("submit", "list", "status", "logs", "delete"):
        assert command in result.output


def printed_url(output: str) -> Any:
    """The URL `status --web` says to open, parsed."""
    from urllib.parse import urlsplit

    line = next(line for line in output.splitlines() if line.startswith("and open "))
    return urlsplit(line.removeprefix("and open "))


async def test_status_web_prints_the_port_forward_to_the_status_page(k8s, kubeconfig):
    import base64
    from urllib.parse import parse_qs

    assert (await run(*submit_args("webbed", kubeconfig))).exit_code == 0
    result = await run("status", "webbed", "-n", "ml", "--kubeconfig", kubeconfig, "--web",
                       "--local-port", "18080")
    assert result.exit_code == 0, result.output
    assert "kubectl -n ml port-forward svc/webbed-master 18080:9090" in result.output
    url = printed_url(result.output)
    assert (url.scheme, url.netloc, url.path) == ("http", "127.0.0.1:18080", "/")
    # the viewer token the job's masters take (their --tokens-dir is this Secret)
    viewer = base64.b64decode(k8s.stored("secrets", "ml", "webbed-tokens")["data"]["viewer"]).decode()
    assert parse_qs(url.query) == {"token": [viewer]}
    assert "no viewer token" not in result.output
    missing = await run("status", "ghost", "-n", "ml", "--kubeconfig", kubeconfig, "--web")
    assert missing.exit_code == 1 and "job ghost not found in namespace ml" in missing.output


@pytest.mark.parametrize("status", [403, 404])
async def test_status_web_without_the_secret_says_where_the_token_is(k8s, kubeconfig, status):
    assert (await run(*submit_args("hidden", kubeconfig))).exit_code == 0
    k8s.fail("get", "secrets", status=status, times=10, message="secrets is forbidden")
    result = await run("status", "hidden", "-n", "ml", "--kubeconfig", kubeconfig, "--web")
    assert result.exit_code == 0, result.output
    assert "kubectl -n ml port-forward svc/hidden-master 9090:9090" in result.output
    assert printed_url(result.output).query == "token=TOKEN"
    assert ("no viewer token: Secret hidden-tokens (key viewer) could not be read; replace TOKEN "
            "with what `kubectl -n ml get secret hidden-tokens -o jsonpath='{.data.viewer}' | "
            "base64 -d` prints") in result.output


def trainer_env(k8s: Any, name: str) -> dict[str, str]:
    """The trainer pods' environment as the job's master renders it from the stored spec."""
    spec = JobSpec.from_yaml(k8s.stored("configmaps", "ml", f"{name}-spec")["data"]["job.yaml"])
    container = manifests.trainer_job(spec, None)["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in container["env"]}


@pytest.mark.parametrize(("given", "passed"), [("50", "50"), ("2m", "120s")])
async def test_submit_checkpoint_every_reaches_the_trainers(k8s, kubeconfig, given, passed):
    result = await run(*submit_args("resumable", kubeconfig, "--pservers", "0",
                                    "--checkpoint-every", given, "-e", "GLOG_v=1"))
    assert result.exit_code == 0, result.output
    env = trainer_env(k8s, "resumable")
    assert env["PADDLECLOUD_CHECKPOINT_EVERY"] == passed and env["GLOG_v"] == "1"


async def test_submit_refuses_a_bad_checkpoint_every_naming_it(k8s, kubeconfig):
    bad = await run(*submit_args("nope", kubeconfig, "--checkpoint-every", "fifty"))
    assert bad.exit_code == 2
    assert "'--checkpoint-every'" in bad.output and "'fifty'" in bad.output
    twice = await run(*submit_args("nope", kubeconfig, "--checkpoint-every", "5",
                                   "-e", "PADDLECLOUD_CHECKPOINT_EVERY=9"))
    assert twice.exit_code == 2
    assert "--checkpoint-every 5 sets PADDLECLOUD_CHECKPOINT_EVERY, which -e sets as well" in twice.output
    assert k8s.posted() == []  # refused before any API call
