"""Faults of a real fleet PS job (Paddle 2.6.2) that paddlecloud must survive (issue 41, point 2).

Each test is one run of tests/ps_faults.py (what `make ps-proof` runs too; `make test` runs the
trainer-0 restart and leaves the two marked `ps_proof` to `make ps-proof`, for the suite's time): the job must finish,
the surviving trainer must neither die nor see its loss jump back (a model reset), the master's
tasks must all be trained each epoch, and at most the task a dead trainer was cut in may reach
the model twice.
"""

from __future__ import annotations

import re

import pytest

pytestmark = [pytest.mark.paddle_ps, pytest.mark.chaos, pytest.mark.timeout(480)]


def _run(fault: str, tmp_path):
    from paddle_ps import paddle_ps_python
    from ps_faults import run_fault

    run = run_fault(fault, tmp=tmp_path, python=paddle_ps_python(), epochs=3)
    assert run.ok, run.line() + "\n" + "\n".join(run.console.splitlines()[-40:])
    return run


@pytest.mark.ps_proof
def test_a_sigkilled_trainer_is_restarted_and_the_job_finishes_without_aborting_the_other(tmp_path):
    run = _run("trainer-kill", tmp_path)
    assert "trainer 1 exited with 137: restarting it" in run.console


@pytest.mark.ps_proof
def test_a_sigkilled_gloo_trainer_restarts_the_trainer_group_and_the_job_finishes(tmp_path):
    """PADDLE_WITH_GLOO=1 (seed 003 Example 1's withGloo: 1): Paddle alone leaves the restarted
    trainer waiting for ever in fleet.init (pserver 0's store is gone) and aborts the survivor
    at its next barrier; paddlecloud serves the store and restarts the group on the live model."""
    run = _run("trainer-kill-gloo", tmp_path)
    assert "serving the trainers' gloo rendezvous store at 127.0.0.1:" in run.console
    assert "trainer 1 died: restarting the trainer group" in run.console
    assert "trainer 0: the pservers hold a model: pulled it, pushed nothing" in run.console
    assert "the master restarted epoch" not in run.console  # the pservers kept the model


def test_a_restarted_trainer_0_does_not_reset_the_pservers_model(tmp_path):
    run = _run("trainer0-restart", tmp_path)
    assert "trainer 0: the pservers hold a model: pulled it, pushed nothing" in run.console


@pytest.mark.ps_proof
def test_a_sigkilled_pserver_restarts_the_ps_group_from_the_last_checkpoint(tmp_path):
    run = _run("pserver-kill", tmp_path)
    assert "restarting the pservers and trainers from the last checkpoint (PS group restart 1)" in run.console
    restarted = re.search(r"the master restarted epoch (\d+)", run.console)
    assert restarted and int(restarted.group(1)) >= 1, run.console[-4000:]  # after a checkpoint
    saved = int(restarted.group(1)) - 1
    assert f"trainer 0: loaded the checkpoint of epoch {saved} into the pservers" in run.console


@pytest.mark.ps_proof
def test_a_sigkilled_pserver_under_gloo_restarts_the_ps_group_with_every_trainer_loading(tmp_path):
    """Under gloo Paddle's save_persistables and load_model wait for every trainer (barriers):
    the group restart's checkpoint load must not hang with trainer 0 alone in it."""
    run = _run("pserver-kill-gloo", tmp_path)
    assert "restarting the pservers and trainers from the last checkpoint (PS group restart 1)" in run.console
    assert "trainer 0: loaded the checkpoint of epoch" in run.console
