"""paddle-operator's tutorial (seed 003), Examples 1-4 verbatim, EDL's TrainingJob (seed 004's
shape, tests/k8s/edl/examplejob.yaml) and a `--module` job: the pods
`job submit` renders run on a real container engine, on images shaped like the tutorial's, and
do their work.

The images are built as the tutorial builds them (as root, the program in its WORKDIR, an
ENTRYPOINT or a CMD, no paddlecloud inside) and tagged with the tutorial's names, so the YAML
stays as written. The PS examples' program checks the environment PaddlePaddle's role maker
reads, writes into its working directory, and talks to its peers by the names in that
environment; Example 2's image holds a real Paddle (CPU) and its command runs Paddle's own
launcher, which trains with fleet over gloo (3.x, and 2.6.2's legacy launcher: Paddle 2.x's
`paddle.distributed.launch`). paddlecloud's own containers run from paddlecloud's
image, built from this tree. A real etcd and a real master (TLS, the job's tokens) run on
the host, at the address the master Service's name resolves to in the pods.

The operator renders the same pods (`pdj_operator` calls the same `translate` and the master
renders them from the job spec), so `job submit -f --dry-run` is the rendering tested.
What the harness does and does not cover: tests/k8s/pod_runner.py.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pod_runner
import pytest
import yaml

from paddlecloud.auth import JobTokens
from paddlecloud.backends.k8s import manifests
from paddlecloud.etcd_server import EtcdServer
from paddlecloud.jobspec import JobSpec
from paddlecloud.master_flags import master_flags
from paddlecloud.tls import issue_master_certificate
from tests import containers, seed003_resnet

pytestmark = [pytest.mark.container, pytest.mark.timeout(900)]

SEEDS = Path(__file__).resolve().parent / "seed003"
WIDE_AND_DEEP = "registry.baidubce.com/paddle-operator/demo-wide-and-deep:v1"
STARTED = 240  # seconds for a pod's init containers and its program to start, on a busy machine

# wide_and_deep/train.py: a pserver finds itself in the pserver list (as PaddleCloudRoleMaker
# does), takes a while to load, then serves; a trainer reads its id and asks every pserver.
WIDE_AND_DEEP_TRAIN = r'''
import json, os, socket, time
role = os.environ["TRAINING_ROLE"]
pservers = os.environ["PADDLE_PSERVERS_IP_PORT_LIST"].split(",")
assert len(pservers) == int(os.environ["PADDLE_PSERVERS_NUM"])
trainers = int(os.environ["PADDLE_TRAINERS_NUM"])
os.makedirs("log", exist_ok=True)
report = {"role": role, "uid": os.getuid(), "cwd": os.getcwd(), "trainers": trainers,
          "gloo": os.environ.get("PADDLE_WITH_GLOO")}
if role == "PSERVER":
    index = pservers.index(os.environ["POD_IP"] + ":" + os.environ["PADDLE_PORT"])
    report["index"] = index
    open(f"log/pserver.{index}.json", "w").write(json.dumps(report))
    time.sleep(3)  # loading its tables: the trainers must wait for it, not race it
    server = socket.create_server(("0.0.0.0", int(os.environ["PADDLE_PORT"])))
    print("pserver", index, "serving", flush=True)
    while True:
        conn, _ = server.accept()
        conn.sendall(f"pserver {index}\n".encode())
        conn.close()
else:
    assert role == "TRAINER", role
    trainer_id = int(os.environ["PADDLE_TRAINER_ID"])
    assert 0 <= trainer_id < trainers
    answers = []
    for endpoint in pservers:  # once, no retry: the pod started after every pserver listened
        host, port = endpoint.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            answers.append(conn.makefile().readline().strip())
    report.update(id=trainer_id, answers=answers)
    open(f"log/trainer.{trainer_id}.json", "w").write(json.dumps(report))
    print(json.dumps(report), flush=True)
'''
WIDE_AND_DEEP_CONTAINERFILE = f"""\
FROM {containers.BASE_IMAGE}
ADD wide_and_deep /wide_and_deep
WORKDIR /wide_and_deep
ENTRYPOINT ["python3", "train.py"]
"""

# EDL's job image: `python train.py` in its workspace, as the TrainingJob's entrypoint says,
# and the image's own `paddle_k8s`, which EDL's controller ran in the pservers (a stand-in for
# paddlepaddle/paddlecloud-job's script: its pserver commands start the job's pserver program).
EDL_IMAGE = "paddlepaddle/paddlecloud-job"
EDL_TRAIN = r'''
import os
# what EDL's TrainingJob gives its programs: passes and the ports of Paddle v2's pservers
assert os.environ["PADDLE_INIT_NUM_PASSES"] == "10", os.environ.get("PADDLE_INIT_NUM_PASSES")
assert (os.environ["PADDLE_INIT_PORT"], os.environ["PADDLE_INIT_PORTS_NUM"],
        os.environ["PADDLE_INIT_PORTS_NUM_FOR_SPARSE"]) == ("7164", "1", "1")
if os.environ["TRAINING_ROLE"] == "PSERVER":  # started as EDL started it, not as a trainer
    assert os.environ.get("STARTED_BY") == "paddle_k8s start_new_pserver", os.environ.get("STARTED_BY")
''' + WIDE_AND_DEEP_TRAIN
EDL_PADDLE_K8S = """\
#!/bin/sh
case "$1" in
  start_pserver|start_new_pserver) cd "$TRAINER_PACKAGE" && STARTED_BY="paddle_k8s $1" exec python train.py ;;
  *) echo "paddle_k8s: no command $1 here" >&2; exit 2 ;;
esac
"""
EDL_CONTAINERFILE = f"""\
FROM {containers.BASE_IMAGE}
RUN ln -s /usr/bin/python3 /usr/local/bin/python
ADD workspace /workspace
WORKDIR /workspace
ADD paddle_k8s /usr/bin/paddle_k8s
RUN chmod 755 /usr/bin/paddle_k8s
"""


@pytest.fixture(scope="module")
def paddlecloud_image() -> str:
    image = containers.paddlecloud_image()
    containers.build_image(WIDE_AND_DEEP, containerfile=WIDE_AND_DEEP_CONTAINERFILE,
                           files={"wide_and_deep/train.py": WIDE_AND_DEEP_TRAIN})
    containers.build_image(EDL_IMAGE, containerfile=EDL_CONTAINERFILE,
                           files={"workspace/train.py": EDL_TRAIN, "paddle_k8s": EDL_PADDLE_K8S})
    return image


@pytest.fixture(scope="module")
def resnet_image(paddlecloud_image) -> str:
    """Example 2's image, with the Paddle the tests run (3.x)."""
    return seed003_resnet.build(seed003_resnet.IMAGE, containers.paddle_base_image())


def render(submit: list[str], *, etcd: str, paddlecloud_image: str) -> list[dict]:
    """What `paddlecloud job submit SUBMIT...` creates and what the job's master creates."""
    result = subprocess.run(
        [sys.executable, "-m", "paddlecloud", "job", "submit", *submit, "--dry-run",
         "--etcd-endpoints", etcd, "--paddlecloud-image", paddlecloud_image],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def the_job_s_secret(spec: JobSpec) -> dict[str, bytes]:
    """The tokens Secret `job submit` creates: the role tokens, the master's TLS files."""
    certificate = issue_master_certificate(manifests.master_certificate_hosts(spec.name, spec.namespace),
                                           job=spec.name)
    secret = manifests.tokens_secret(spec, JobTokens.generate().as_mapping(), None, certificate=certificate)
    return {key: base64.b64decode(value) for key, value in secret["data"].items()}


def start_etcd(address: str, tmp_path: Path) -> EtcdServer:
    server = EtcdServer(str(tmp_path / "etcd"))
    client = f"http://127.0.0.1:{server.client_port},http://{address}:{server.client_port}"
    server.extra_args = ("--listen-client-urls", client,
                         "--advertise-client-urls", f"http://{address}:{server.client_port}")
    return server.start()


def start_master(spec: JobSpec, secret: dict[str, bytes], *, address: str, etcd: str,
                 tmp_path: Path) -> subprocess.Popen:
    """The job's master on the host, where `NAME-master.NS.svc` resolves in the pods."""
    tokens = tmp_path / "master-tokens"
    tokens.mkdir(mode=0o700)
    for key, value in secret.items():
        (tokens / key).write_bytes(value)
    flags = master_flags(job=spec.name, namespace=spec.namespace, etcd_endpoints=etcd, host=address,
                         port=manifests.MASTER_PORT, advertise=f"{address}:{manifests.MASTER_PORT}",
                         tokens_dir=str(tokens), tls_cert=str(tokens / manifests.TLS_CERT_KEY),
                         tls_key=str(tokens / manifests.TLS_KEY_KEY))
    with open(tmp_path / "master.log", "wb") as log:
        return subprocess.Popen([sys.executable, "-m", "paddlecloud", "master", *flags], stdout=log,
                                stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"))


def run_job(submit: list[str], *, paddlecloud_image: str, tmp_path: Path,
            reports: str = "log") -> dict[str, dict]:
    """Runs the pods of `job submit SUBMIT...` to the trainers' end; returns what each program
    reported (the files in its `reports` folder), by pod."""
    with pod_runner.node(tmp_path) as node:
        etcd = start_etcd(node.gateway, tmp_path)
        master = None
        try:
            docs = render(submit, etcd=etcd.endpoint.replace("127.0.0.1", node.gateway),
                          paddlecloud_image=paddlecloud_image)
            configmap = next(d for d in docs if d["kind"] == "ConfigMap")
            spec = JobSpec.from_yaml(configmap["data"][manifests.SPEC_KEY])
            secret = the_job_s_secret(spec)
            master = start_master(spec, secret, address=node.gateway, etcd=etcd.endpoint,
                                  tmp_path=tmp_path)
            pods = pod_runner.pods_of(docs)
            node.assign(pods)
            hosts = pod_runner.dns_names(docs, pods, host_ip=node.gateway)
            threads = [node.start(pod, hosts=hosts, secrets={manifests.tokens_secret_name(spec.name): secret},
                                  claims={}) for pod in pods]
            return collect(node, pods, threads, reports)
        finally:
            if master is not None:
                master.terminate()
                master.wait(timeout=30)
            etcd.stop()


def collect(node: pod_runner.Node, pods: list[pod_runner.Pod], threads: list, reports_in: str) -> dict[str, dict]:
    deadline = time.monotonic() + STARTED
    while alive := [t for t in threads if t.is_alive()]:  # every pod started, or one failed
        failed = node.failed(pods)
        assert not failed, failed
        assert time.monotonic() < deadline, f"pods not started in {STARTED}s: {[t.name for t in alive]}"
        alive[0].join(timeout=1)
    for pod in pods:
        if pod.error is not None:
            raise pod.error
    reports: dict[str, dict] = {}
    for pod in pods:
        role = pod.labels[manifests.ROLE_LABEL]
        main = pod.spec["containers"][0]["name"]
        if role == manifests.TRAINER:
            code = node.wait_exit(pod, main, timeout=STARTED)
            assert code == 0, f"trainer {pod.name} exited {code}:\n{node.logs(pod, main)}"
            wait_master = node.logs(pod, "wait-master")
            assert "the master serves and" in wait_master, wait_master
        reports[pod.name] = {"log": node.logs(pod, main), "files": node.copy_out(pod, main, reports_in)}
    return reports


def report_files(reports: dict[str, dict]) -> list[dict]:
    return [json.loads(path.read_text()) for r in reports.values() for path in sorted(r["files"].iterdir())]


@pytest.mark.parametrize("example", ["example1_wide_and_deep.yaml", "example3_wide_and_deep_gpu.yaml",
                                     "example4_wide_and_deep_volcano.yaml"])
def test_a_ps_example_runs_as_written_as_root_in_its_workdir(example, paddlecloud_image, tmp_path):
    """Example 4 as the refusal of its pservers' `restartPolicy: Never` says to write it (a
    StatefulSet's pods take Always only: tests/k8s/test_seed003.py)."""
    path = SEEDS / example
    if example.startswith("example4"):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        next(d for d in docs if d["kind"] == "PaddleJob")["spec"]["ps"]["template"]["spec"].pop("restartPolicy")
        path = tmp_path / example
        path.write_text(yaml.safe_dump_all(docs))
    reports = run_job(["-f", str(path)], paddlecloud_image=paddlecloud_image, tmp_path=tmp_path)
    found = report_files(reports)
    pservers = sorted(r["index"] for r in found if r["role"] == "PSERVER")
    trainers = sorted(r["id"] for r in found if r["role"] == "TRAINER")
    assert (pservers, trainers) == ([0, 1], [0, 1])
    for report in found:  # the image's user, in the image's WORKDIR, writing there
        assert (report["uid"], report["cwd"], report["trainers"]) == (0, "/wide_and_deep", 2)
        if report["role"] == "TRAINER":
            assert report["answers"] == ["pserver 0", "pserver 1"]
            assert report["gloo"] == ("1" if "example3" not in example else None)  # withGloo: 1


def test_example2_runs_paddle_s_own_launcher_as_written(paddlecloud_image, resnet_image, tmp_path):
    """Example 2's `python -m paddle.distributed.launch train_fleet.py`, the real launcher of
    the tests' Paddle (3.x): trainer 0's launcher serves the rendezvous (its POD_IP is the host
    of PADDLE_MASTER), both meet there, and fleet trains over gloo to the end."""
    from importlib.metadata import version

    reports = run_job(["-f", str(SEEDS / "example2_resnet.yaml")], paddlecloud_image=paddlecloud_image,
                      tmp_path=tmp_path, reports="out")
    seed003_resnet.assert_trained_as_one_job(report_files(reports), paddle=version("paddlepaddle"))
    for report in reports.values():  # Paddle's launcher ran the program, as written
        assert "LAUNCH INFO" in report["log"], report["log"][-2000:]


def test_a_paddle_2_launcher_command_runs_as_written(paddlecloud_image, tmp_path):
    """Example 2 on Paddle 2.6.2 with Paddle 2.x's launcher: `--legacy=true` reaches the code
    that was `paddle.distributed.launch` up to 2.2 (paddle/distributed/fleet/launch.py), which
    builds a job of all pods only from PADDLE_TRAINERS, POD_IP among them, and
    TRAINER_PORTS_NUM (else each pod trains alone). Its 2.3+ default launcher is the code the
    3.x test runs (the same collective controller and plugins)."""
    image = seed003_resnet.build(seed003_resnet.IMAGE_PADDLE2, containers.paddle2_base_image())
    job = yaml.safe_load((SEEDS / "example2_resnet.yaml").read_text())
    job["metadata"]["name"] = "resnet2"
    paddle = job["spec"]["worker"]["template"]["spec"]["containers"][0]
    paddle.update(image=image, args=["-m", "paddle.distributed.launch", "--legacy=true",
                                              "train_fleet.py"])
    written = tmp_path / "resnet2.yaml"
    written.write_text(yaml.safe_dump(job))
    reports = run_job(["-f", str(written)], paddlecloud_image=paddlecloud_image, tmp_path=tmp_path,
                      reports="out")
    seed003_resnet.assert_trained_as_one_job(report_files(reports), paddle=containers.PADDLE_2_VERSION)
    for report in reports.values():  # the legacy launcher started the program
        assert "launch proc_id" in report["log"], report["log"][-2000:]


def test_module_runs_in_the_job_s_image_which_holds_no_paddlecloud(paddlecloud_image, tmp_path):
    """`job submit --image IMG --module M`: `python3 -m M` in IMG (no `python`, no paddlecloud
    there), as its own user, in its own WORKDIR."""
    reports = run_job(["mod", "--image", WIDE_AND_DEEP, "--module", "train", "--pservers", "2",
                       "--trainers", "2"], paddlecloud_image=paddlecloud_image, tmp_path=tmp_path)
    found = report_files(reports)
    assert sorted((r["role"], r.get("index", r.get("id"))) for r in found) == [
        ("PSERVER", 0), ("PSERVER", 1), ("TRAINER", 0), ("TRAINER", 1)]
    for report in found:
        assert (report["uid"], report["cwd"]) == (0, "/wide_and_deep")


def test_edl_s_trainingjob_runs_its_entrypoint_in_its_workspace(paddlecloud_image, tmp_path):
    """EDL's TrainingJob: `sh -c ENTRYPOINT` in the workspace, on the image as its user; the
    pservers by the image's `paddle_k8s start_new_pserver`, as EDL's controller started them;
    the trainers at min-instance, the pservers fixed; passes and ports where EDL put them."""
    reports = run_job(["-f", str(Path(__file__).resolve().parent / "edl" / "examplejob.yaml")],
                      paddlecloud_image=paddlecloud_image, tmp_path=tmp_path)
    found = report_files(reports)
    assert sorted((r["role"], r.get("index", r.get("id"))) for r in found) == [
        ("PSERVER", 0), ("PSERVER", 1), ("TRAINER", 0), ("TRAINER", 1)]
    for report in found:
        assert (report["uid"], report["cwd"]) == (0, "/workspace")
        if report["role"] == "TRAINER":
            assert report["answers"] == ["pserver 0", "pserver 1"]

