"""The local job's console: Paddle's banner left out (its log keeps it), and without a
terminal the last progress line is how the job ended."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from paddlecloud.backends.local.job import Progress
from paddlecloud.backends.local.noise import PaddleNoise
from paddlecloud.backends.local.view import ConsoleView

pytestmark = pytest.mark.unit

BANNER = ["======================= Modified FLAGS detected =======================",
          "FLAGS(name='FLAGS_enable_pir_in_executor', current_value=True, default_value=False)",
          "FLAGS(name='FLAGS_other', current_value=1, default_value=0)",
          "======================================================================="]


def test_paddle_s_banner_is_left_out_and_every_other_line_kept():
    noise = PaddleNoise()
    lines = ["before", *BANNER, "after", "=====", "FLAGS(name='x') said by the user", *BANNER[:2], "next"]
    assert [line for line in lines if noise.keep(line)] == [
        "before", "after", "=====", "FLAGS(name='x') said by the user", "next"]


def test_without_a_terminal_the_last_progress_line_is_printed_at_the_end():
    out = io.StringIO()
    view = ConsoleView(Console(file=out, force_terminal=False, width=200))
    with view:
        view.progress(Progress(phase="Running", epoch=1, num_epochs=2, num_tasks=4))
        view.progress(Progress(phase="Succeeded", epoch=2, num_epochs=2, done=4, num_tasks=4))
        assert "Succeeded" not in out.getvalue()  # held back: less than two seconds after the last
        view.finish()
        view.finish()
    lines = out.getvalue().splitlines()
    assert lines == ["[progress] Running, epoch 1 of 0..1, tasks 0/4, trainers alive 0, re-queued 0, restarts 0",
                     "[progress] Succeeded, epoch 1 of 0..1, tasks 4/4, trainers alive 0, re-queued 0, "
                     "restarts 0"]


def test_a_member_that_aborted_beside_a_killed_one_is_named_as_its_consequence(tmp_path):
    from types import SimpleNamespace

    from paddlecloud.backends.local.children import Child
    from paddlecloud.backends.local.deployer import group_loss

    def exited(index: int, code: int) -> Child:
        child = Child(role="trainer", index=index, command=["true"], env={}, log_dir=tmp_path,
                      on_line=lambda who, text: None)
        child.process = SimpleNamespace(returncode=code)  # the launcher's exit code: 128 + signal
        return child

    assert group_loss([exited(0, 137), exited(1, 134)]) == (
        "trainer 0 died, and trainer 1 aborted without its gloo peer")
    assert group_loss([exited(1, 137)]) == "trainer 1 died"
    assert group_loss([exited(0, 134), exited(1, 134)]) == "trainer 0, trainer 1 died"  # no other cause


def test_the_progress_line_counts_no_more_trainers_alive_than_trainer_processes_run(tmp_path):
    """Both trainers SIGKILLed: the master still counts their sessions until the leases lapse
    (seconds), and the progress line said "trainers alive 2" meanwhile."""
    from types import SimpleNamespace

    from paddlecloud.api import pb
    from paddlecloud.backends.local.job import LocalJob, LocalJobSpec

    job = LocalJob(LocalJobSpec(job="j", module="trainer_agent.stub", output=tmp_path, inputs=("x",),
                                trainers=2), on_line=lambda *_: None)
    status = pb.GetStatusResponse(phase="Running", trainers_alive=2, num_tasks=4)
    job.deployer.trainers = [SimpleNamespace(running=True), SimpleNamespace(running=True)]
    job._take_status(status)
    assert job.progress.trainers_alive == 2
    job.deployer.trainers = [SimpleNamespace(running=False), SimpleNamespace(running=False)]
    job._take_status(status)
    assert job.progress.trainers_alive == 0
    assert "trainers alive 0" in ConsoleView.plain(job.progress)
