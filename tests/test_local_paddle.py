"""The README's main command for real: the fit-a-line example trained by gloo trainers."""

from __future__ import annotations

import os
import re
import signal

import pytest
from etcd_history import check_job_exactly_once
from local_runs import LocalRun
from masters import wait_until
from processes import find, job_processes

from paddlecloud.keys import JobKeys

pytest.importorskip("paddle")
pytestmark = pytest.mark.paddle

EXAMPLE = "examples.fit_a_line.train"


def losses(text: str, trainer: int) -> list[float]:
    return [float(m) for m in re.findall(rf"\[trainer {trainer}\] epoch \d+ loss ([0-9.]+)", text)]


@pytest.fixture
def example_run(tmp_path, job_name):
    runs = []

    def start(*args: str) -> LocalRun:
        run = LocalRun(tmp_path, job_name, "--example", "fit-a-line", *args)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.stop()


@pytest.mark.timeout(300)
def test_example_job_trains_and_leaves_a_model_and_no_process(example_run, job_name):
    run = example_run("--epochs", "3")
    assert run.wait(timeout=280) == 0, run.text()[-3000:]
    text = run.text()
    first, last = losses(text, 0), losses(text, 1)
    assert len(first) == 3 and first == last  # one model, kept in step by the collective
    assert first[-1] < first[0] / 2
    assert (run.output / "model" / "model.pdparams").exists()
    assert sorted(p.name for p in (run.output / "checkpoints").iterdir() if p.name.startswith("checkpoint-"))
    assert job_processes(job_name) == []
    # a quiet console: Paddle's banner only in the trainers' logs, no INSECURE for a loopback job
    assert "Modified FLAGS detected" in (run.output / "logs" / "trainer-0.log").read_text()
    assert "FLAGS" not in text and "INSECURE" not in text and "=====" not in text
    # the output ends with how the job ended, terminal or not
    last = [line for line in text.splitlines() if line.startswith("[progress]")][-1]
    assert re.match(r"\[progress\] Succeeded, epoch 2 of 0\.\.2, tasks (\d+)/\1,", last), last


@pytest.mark.timeout(300)
def test_a_killed_trainer_restarts_the_group_from_the_checkpoint(example_run, job_name, etcd_endpoint):
    run = example_run("--epochs", "4", "--etcd-endpoints", etcd_endpoint)
    wait_until(lambda: "[trainer 0] epoch 1 loss" in run.text(), timeout=240, message="epoch 1 never ended")
    victim = find(job_name, module=EXAMPLE, PADDLE_TRAINER_ID="1")
    assert victim, "trainer 1 is not running"
    os.kill(victim[0], signal.SIGKILL)
    assert run.wait(timeout=280) == 0, run.text()[-3000:]
    text = run.text()
    assert "restarting the trainer group" in text
    assert re.search(r"the master restarted epoch [12]", text)
    assert "resumed from the checkpoint of epoch" in text
    check_job_exactly_once(etcd_endpoint, JobKeys("local", job_name), num_tasks=4, num_epochs=4)
    assert (run.output / "model" / "model.pdparams").exists()
