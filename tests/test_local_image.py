"""`paddlecloud local train --image IMG` (seed 002): trainers and pservers in containers, run for real.

The image is shaped like the seeds' users' images: built as root, its program in the WORKDIR,
an ENTRYPOINT, no paddlecloud inside. Its program checks the environment a trainer or pserver
gets, reaches the job's etcd and the pservers over the route the job gives it, reads
/train/input, writes into its working directory and into /train/output, and reports what it
saw in a file the test reads from --output.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from datasets import write_records
from processes import job_processes

from paddlecloud.backends.local.container import force_remove, remove_containers
from tests import containers, seed003_resnet

pytestmark = [pytest.mark.container, pytest.mark.timeout(900)]

PROGRAM = r'''
import json, os, signal, socket, sys, time

env = os.environ
role = env.get("TRAINING_ROLE", "")
if role == "PSERVER":
    # a pserver serves until it is stopped; it listens where the trainers are told it is
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server = socket.create_server(("0.0.0.0", int(env["PADDLE_PORT"])), reuse_port=True)
    while True:
        server.accept()[0].close()

def reach(endpoint):
    host, port = endpoint.split("://")[-1].rsplit(":", 1)
    socket.create_connection((host, int(port)), timeout=30).close()
    return endpoint

wanted = ("PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM", "PADDLE_PSERVERS_IP_PORT_LIST", "PADDLE_JOB_NAME",
          "PADDLE_ETCD_ENDPOINTS", "NUM_PASS", "PADDLE_JOB_TOKEN_FILE")
missing = [name for name in wanted if not env.get(name)]
if missing:
    sys.exit(f"missing {missing}")
os.makedirs("log", exist_ok=True)  # into the image's root-owned WORKDIR, as Paddle's launcher does
open(f"log/trainer-{env['PADDLE_TRAINER_ID']}", "w").write("ok")
report = {
    "role": role, "cwd": os.getcwd(), "uid": os.getuid(), "path": env.get("PATH", ""),
    "num_pass": env["NUM_PASS"], "trainers": env["PADDLE_TRAINERS_NUM"],
    "token_file": env["PADDLE_JOB_TOKEN_FILE"], "token": bool(open(env["PADDLE_JOB_TOKEN_FILE"]).read()),
    "etcd": reach(env["PADDLE_ETCD_ENDPOINTS"].split(",")[0]),
    "pservers": [reach(e) for e in env["PADDLE_PSERVERS_IP_PORT_LIST"].split(",")],
    "input": sorted(os.listdir("/train/input")),
    "records": sum(1 for _ in open("/train/input/part-00000.csv")),
    "workdir_log": os.listdir("log"),
    # the job's state folder: hidden (an empty tmpfs), and what is written there stays there
    "state": sorted(os.listdir("/train/output/.paddlecloud")),
    "operator_token": os.path.exists("/train/output/.paddlecloud/tokens/operator"),
}
open("/train/output/.paddlecloud/planted", "w").write("written by the program")
json.dump(report, open(f"/train/output/trainer-{env['PADDLE_TRAINER_ID']}.json", "w"))
'''
CONTAINERFILE = f"""\
FROM {containers.BASE_IMAGE}
ADD wide_and_deep /wide_and_deep
WORKDIR /wide_and_deep
ENTRYPOINT ["python3", "train.py"]
"""
# A module in the package path that never ends and ignores SIGTERM as a PID 1 does: only the
# engine's stop (SIGKILL after the grace) ends it.
STUBBORN = """\
import time
try:
    open("/train/package/x", "w")
except OSError as error:
    print("package mount:", error.strerror, flush=True)
print("stubborn started", flush=True)
while True:
    time.sleep(1)
"""


@pytest.fixture(scope="module")
def user_image():
    containers.base_image()
    return containers.build_image("localhost/paddlecloud-test-seed002:1", containerfile=CONTAINERFILE,
                                  files={"wide_and_deep/train.py": PROGRAM})


def local_train(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    console = (tmp_path / "console.txt").open("wb")
    return subprocess.Popen([sys.executable, "-m", "paddlecloud", "local", "train", "--output",
                             str(tmp_path / "out"), *args], cwd=tmp_path, stdout=console,
                            stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


def job_containers(job: str) -> list[str]:
    listed = containers.run_engine("ps", "--all", "--filter", f"label=paddlecloud.job={job}",
                                   "--format", "{{.Names}}", timeout=60)
    return listed.stdout.split()


def console(tmp_path: Path) -> str:
    return (tmp_path / "console.txt").read_text(errors="replace")


def test_trainers_and_pservers_run_in_the_image_with_the_seeds_mounts_and_environment(tmp_path, user_image):
    write_records(tmp_path / "data", files=2, records_per_file=5)
    job = "seed002-image"
    run = local_train(tmp_path, "--job", job, "--image", user_image, "--input", str(tmp_path / "data" / "*.csv"),
                      "--trainers", "2", "--pservers", "1", "-e", "NUM_PASS=4")
    code = run.wait(timeout=600)
    out = tmp_path / "out"
    reports = {path.name: json.loads(path.read_text()) for path in out.glob("trainer-*.json")}
    assert sorted(reports) == ["trainer-0.json", "trainer-1.json"], console(tmp_path)[-4000:]
    for report in reports.values():
        assert report["role"] == "TRAINER" and report["uid"] == 0 and report["cwd"] == "/wide_and_deep"
        assert report["num_pass"] == "4" and report["trainers"] == "2"
        assert report["token"] and report["token_file"] == "/var/run/paddlecloud/tokens/trainer"
        assert report["state"] == [] and report["operator_token"] is False
        assert report["etcd"].startswith("http://127.0.0.1:") and len(report["pservers"]) == 1
        assert report["input"] == ["part-00000.csv", "part-00001.csv"] and report["records"] == 5
        assert report["path"] != os.environ["PATH"]  # the image's PATH, not the host's
    assert sorted(reports["trainer-1.json"]["workdir_log"]) == ["trainer-1"]
    assert not (out / ".paddlecloud" / "planted").exists()  # it stayed in the container's tmpfs
    text = console(tmp_path)
    assert "[pserver 0]" in text and (out / "logs" / "trainer-1.log").exists()
    # No trainer took a task from the master: the job ends by its trainers' exits (0), as under
    # paddle-operator; and nothing is left running.
    assert code == 0, text[-3000:]
    assert job_containers(job) == []


def stubborn_trainers(tmp_path: Path, job: str, image: str, *args: str) -> subprocess.Popen:
    """Two trainers of `image` running STUBBORN from --package-path with --module."""
    write_records(tmp_path / "data", files=1, records_per_file=5)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "stubborn.py").write_text(STUBBORN)
    return local_train(tmp_path, "--job", job, "--image", image, "--module", "stubborn", *args,
                       "--package-path", str(tmp_path / "pkg"), "--input", str(tmp_path / "data"),
                       "--trainers", "2")


def test_sigterm_stops_and_removes_every_container(tmp_path, user_image):
    job = "seed002-sigterm"
    run = stubborn_trainers(tmp_path, job, user_image, "--engine", Path(containers.engine()).name)
    wait_for_lines(run, tmp_path, "stubborn started", 2)
    assert "package mount: Read-only file system" in console(tmp_path)
    names = job_containers(job)
    assert sorted(names) == [f"paddlecloud-{job}-trainer-0", f"paddlecloud-{job}-trainer-1"]
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=120) == 128 + signal.SIGTERM, console(tmp_path)[-3000:]
    assert job_containers(job) == []


def test_a_container_its_killed_wrapper_left_is_replaced_and_the_run_s_leftovers_removed(tmp_path, user_image):
    job = "seed002-leftover"
    run = stubborn_trainers(tmp_path, job, user_image)
    wait_for_lines(run, tmp_path, "stubborn started", 2)
    wrapper = next(pid for pid, argv, env in job_processes(job)
                   if "paddlecloud.backends.local.container" in argv and env.get("PADDLE_TRAINER_ID") == "0")
    os.kill(wrapper, signal.SIGKILL)  # its engine client and container live on
    # the group restarts once; trainer 0's new wrapper removes the container of the same name
    # first (else its run fails on the name, and the group restarts again)
    wait_for_lines(run, tmp_path, "[trainer 0] stubborn started", 2, at_most=("restarting the trainer group", 1))
    # the new group's rank 0 starts first (a head start: paddlecloud.backends.local.deployer)
    wait_for_lines(run, tmp_path, "[trainer 1] stubborn started", 2, at_most=("restarting the trainer group", 1))
    assert sorted(job_containers(job)) == [f"paddlecloud-{job}-trainer-0", f"paddlecloud-{job}-trainer-1"]
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=120) == 128 + signal.SIGTERM, console(tmp_path)[-3000:]
    assert job_containers(job) == []


def test_remove_containers_removes_every_container_of_the_run_and_no_other(user_image):
    engine = containers.engine()
    for name, run in (("paddlecloud-test-run-a", "run-a"), ("paddlecloud-test-run-b", "run-b")):
        containers.run_engine("run", "-d", "--rm", "--name", name, "--label", f"paddlecloud.run={run}",
                              "--entrypoint", "sleep", user_image, "600", timeout=120)
    try:
        assert remove_containers(engine, "run-a") == ["paddlecloud-test-run-a"]
        left = containers.run_engine("ps", "--all", "--format", "{{.Names}}", timeout=60).stdout.split()
        assert "paddlecloud-test-run-a" not in left and "paddlecloud-test-run-b" in left
    finally:
        force_remove(engine, ["paddlecloud-test-run-a", "paddlecloud-test-run-b"])


def wait_for_lines(run: subprocess.Popen, tmp_path: Path, line: str, count: int, *,
                   at_most: tuple[str, int] = ("", 0)) -> None:
    """Until the console holds `line` `count` times, while it holds `at_most`'s line no more
    often than its count."""
    deadline = time.monotonic() + 300
    while (text := console(tmp_path)).count(line) < count:
        assert run.poll() is None and time.monotonic() < deadline, text[-4000:]
        assert not at_most[0] or text.count(at_most[0]) <= at_most[1], text[-4000:]
        time.sleep(0.5)


def refused(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    write_records(tmp_path / "data", files=1, records_per_file=2)
    run = local_train(tmp_path, "--job", "refused", "--input", str(tmp_path / "data"), *args, env=env)
    assert run.wait(timeout=120) == 2
    text = console(tmp_path)
    errors = [line for line in text.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in text and "etcd started" not in text, text
    assert not (tmp_path / "out" / "logs").exists()
    return errors[0]


def test_an_image_that_is_not_here_is_one_error_naming_it(tmp_path):
    containers.require_engine()
    error = refused(tmp_path, "--image", "localhost/no-such-image:42")
    assert "image 'localhost/no-such-image:42' is not among podman's local images" in error
    assert "podman said: Error: " in error and "image not known" in error


def test_an_engine_that_cannot_answer_says_why(tmp_path):
    if not shutil.which("docker"):
        pytest.skip("no docker client on this machine")
    if subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0:
        pytest.skip("docker's daemon runs here: this is about a client without one")
    error = refused(tmp_path, "--image", containers.BASE_IMAGE, "--engine", "docker")
    assert f"image '{containers.BASE_IMAGE}' is not among docker's local images" in error
    assert "docker said: Cannot connect to the Docker daemon" in error


def test_no_engine_on_the_machine_is_one_clear_error(tmp_path):
    error = refused(tmp_path, "--image", "paddlepaddle/paddle:2.5", env={"PATH": str(tmp_path / "empty")})
    assert "no container engine" in error and "podman or docker" in error


def test_engine_without_image_is_refused(tmp_path):
    error = refused(tmp_path, "--module", "trainer_agent.stub", "--engine", "docker")
    assert "--engine chooses the container engine of --image" in error


@pytest.mark.paddle
def test_seed003_example2_s_image_runs_paddle_s_launcher_as_its_cmd_says(tmp_path):
    """Example 2's image (its CMD `python -m paddle.distributed.launch train_fleet.py`, a real
    Paddle): two trainers, each in its container, their launchers meet at trainer 0's and
    fleet trains one model over gloo; the job ends by their exits."""
    from importlib.metadata import version

    image = seed003_resnet.build(seed003_resnet.IMAGE, containers.paddle_base_image())
    job = "seed003-launch"
    write_records(tmp_path / "data", files=1, records_per_file=5)  # which it does not read
    run = local_train(tmp_path, "--job", job, "--image", image, "--trainers", "2",
                      "--input", str(tmp_path / "data"))
    code = run.wait(timeout=600)
    found = [json.loads(path.read_text()) for path in sorted((tmp_path / "out").glob("trainer.*.json"))]
    assert len(found) == 2, console(tmp_path)[-4000:]
    seed003_resnet.assert_trained_as_one_job(found, paddle=version("paddlepaddle"))
    assert code == 0, console(tmp_path)[-3000:]
    assert job_containers(job) == []


def test_a_module_the_image_cannot_import_is_refused_before_anything_starts(tmp_path, user_image):
    # it used to surface only after the group's restarts, each container failing at once
    error = refused(tmp_path, "--image", user_image, "--module", "quick_start.train")
    assert f"module 'quick_start.train' is not found in image '{user_image}'" in error
    assert job_containers("wide-and-deep") == [] and job_containers("train") == []


def test_the_image_module_check_finds_what_the_image_and_the_package_hold(tmp_path, user_image):
    from paddlecloud.backends.local.container import (
        ContainerSpec,
        EngineError,
        check_module,
        package_mounts,
    )

    spec = ContainerSpec(engine=shutil.which("podman") or "podman", image=user_image, job="", run="")
    check_module(spec, "train")  # the image's WORKDIR program
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "step.py").write_text("")
    with pytest.raises(EngineError, match="module 'demo.step' is not found"):
        check_module(spec, "demo.step")
    check_module(dataclasses.replace(spec, mounts=package_mounts(tmp_path / "demo", top_package=True)),
                 "demo.step")  # seed 002's --package-path=./demo --module=demo.step
