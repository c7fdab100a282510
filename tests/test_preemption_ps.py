"""A preemption of a PS job loses nothing and counts nothing twice: SIGTERM mid-epoch, then a restart.

The pservers hold the model (examples.ps_ids: the records pushed to them). On SIGTERM the
trainers drain (trainer_agent.ps), trainer 0 saves the pservers' model with the tasks the
master counts done as one checkpoint, and every trainer exits as stopped; the next start
has its pservers restore that checkpoint (PADDLECLOUD_PSERVER_RESTORE=1) and deals the
epoch's other tasks only: each record is in the final model once per epoch.
"""

from __future__ import annotations

import json
import signal
from collections import Counter

import pytest
from datasets import write_records
from local_runs import LocalRun
from masters import wait_until

from paddlecloud.checkpoints import checkpoints_dir
from trainer_agent.checkpoint import load_checkpoint

STOPPED = 128 + signal.SIGTERM
EPOCHS = 2


def pushed(run: LocalRun) -> list[tuple[int, str]]:
    if not run.records.exists():
        return []
    lines = run.records.read_text().splitlines()
    return [(int(epoch), record) for epoch, _, record in (line.split("\t") for line in lines)]


@pytest.mark.timeout(300)
def test_a_sigterm_mid_epoch_saves_the_pservers_model_with_the_masters_count_and_resumes_exactly(
        tmp_path, job_name):
    data = tmp_path / "data"
    write_records(data, files=6, records_per_file=30)
    records = {line for path in data.iterdir() for line in path.read_text().splitlines()}
    args = ("--module", "examples.ps_ids.train", "--input", str(data), "--trainers", "2",
            "--pservers", "2", "--epochs", str(EPOCHS), "--chunk-bytes", "100", "--", "--delay", "0.05")
    first = LocalRun(tmp_path, job_name, *args)
    try:
        wait_until(lambda: len(pushed(first)) >= 40, timeout=120,
                   message="the job never got well into epoch 0", details=first.text)
        first.process.send_signal(signal.SIGTERM)
        assert first.wait(timeout=120) == STOPPED, first.text()[-4000:]
    finally:
        first.stop()
    text, before = first.text(), pushed(first)
    assert "trainer 0: stopped" in text and "trainer 1: stopped" in text, text[-4000:]
    assert text.count("saved the pservers' model") == 1, text[-4000:]  # trainer 0's, once
    state, status = load_checkpoint(checkpoints_dir(str(first.output)))
    saved = [tuple(r) for part in state["pservers"].values() for r in part]
    # the model saved is every record pushed before the stop, once; its tasks are the master's
    assert Counter(saved) == Counter(before)
    assert status.in_epoch and status.tasks_done, status

    second = LocalRun(tmp_path, job_name, *args)  # the same output: it resumes there
    try:
        assert second.wait(timeout=240) == 0, second.text()[-4000:]
    finally:
        second.stop()
    model = Counter(tuple(r) for index in range(2) for r in json.loads(
        (second.output / f"model-{index}.json").read_text())["records"])
    expected = Counter((epoch, record) for epoch in range(EPOCHS) for record in records)
    assert model == expected  # each record once per epoch: nothing lost, nothing twice
    assert second.text().count("restored") == 2  # both pservers loaded the stop's checkpoint
    # what the stop saved was not read again
    assert not set(saved) & set(pushed(second)[len(before):])
