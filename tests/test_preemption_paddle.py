"""A preemption loses nothing: SIGTERM to a collective fit-a-line job mid-epoch, then a restart.

The trainers drain to a checkpoint of exactly what the model consumed (trainer_agent.paddle,
`drain_on_stop`), exit as stopped, and the next start resumes there: no step after the last
checkpoint is undone, and each epoch's records are in the model's lineage once each
(`chaos.lineage`, as tests/test_resume_paddle.py checks resizes and deaths).
"""

from __future__ import annotations

import signal

import pytest
from chaos.lineage import lineage, off_by_epoch
from local_runs import LocalRun
from masters import wait_until

from examples.fit_a_line.consumed import read_entries

pytest.importorskip("paddle")
pytestmark = pytest.mark.paddle

STOPPED = 128 + signal.SIGTERM


def steps_in_epoch(log, epoch: int) -> int:
    return sum(1 for entry in read_entries(log) if entry.get("epoch") == epoch and "ids" in entry)


@pytest.mark.timeout(420)
def test_a_sigterm_mid_epoch_saves_where_the_model_is_and_the_restart_resumes_exactly(
        tmp_path, job_name):
    log = tmp_path / "consumed.jsonl"
    args = ("--example", "fit-a-line", "--epochs", "3", "--chunk-bytes", "64KiB", "--trainers", "2",
            "-e", f"FIT_A_LINE_CONSUMED_LOG={log}", "--", "--step-delay", "0.02")
    first = LocalRun(tmp_path, job_name, *args)
    try:
        wait_until(lambda: steps_in_epoch(log, 1) >= 20, timeout=240,
                   message="the job never got well into epoch 1")
        first.process.send_signal(signal.SIGTERM)
        assert first.wait(timeout=120) == STOPPED, first.text()[-4000:]
    finally:
        first.stop()
    text = first.text()
    assert text.count("stopped at step") == 2, text[-4000:]  # both trainers, at one boundary
    entries = read_entries(log)
    saves = [e for e in entries if "saved" in e]
    last_step = max(e["step"] for e in entries if "ids" in e)
    # the stop's checkpoint holds every step taken: nothing to train again
    assert saves and saves[-1]["saved"] == last_step, (saves[-3:], last_step)
    assert saves[-1]["epoch"] == 1 and saves[-1]["tasks_done"], saves[-1]

    second = LocalRun(tmp_path, job_name, *args)
    try:
        assert second.wait(timeout=300) == 0, second.text()[-4000:]
    finally:
        second.stop()
    assert "resumed from the checkpoint inside epoch 1" in second.text()
    resumed = [e["resumed"] for e in read_entries(log) if "resumed" in e]
    assert resumed and resumed[0] == last_step
    assert sorted(lineage(log)) == [0, 1, 2]
    assert off_by_epoch(log, second.output / "data") == {}
