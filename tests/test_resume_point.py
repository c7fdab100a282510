"""Checkpoints saved inside an epoch: what they record, and where a group restart resumes."""

from __future__ import annotations

import pytest

from paddlecloud.checkpoints import resume_epoch, resume_point
from trainer_agent.checkpoint import (
    TrainStatus,
    latest_train_status,
    load_checkpoint,
    save_checkpoint,
)

pytestmark = pytest.mark.unit


def test_a_checkpoint_inside_an_epoch_resumes_that_epoch_with_its_tasks_done(tmp_path):
    path = str(tmp_path / "checkpoints")
    assert resume_point(path) == (0, ())
    save_checkpoint(path, {"w": 1}, TrainStatus(0))
    assert resume_point(path) == (1, ()) and resume_epoch(path) == 1
    save_checkpoint(path, {"w": 2}, TrainStatus(1, tasks_done=(5, 2, 5)))
    assert resume_point(path) == (1, (2, 5)) and resume_epoch(path) == 1
    state, status = load_checkpoint(path)
    assert state == {"w": 2} and status == TrainStatus(1, tasks_done=(2, 5))
    assert status.in_epoch and status.next() == 1
    # a later save inside the same epoch replaces it; the epoch's end replaces that one
    save_checkpoint(path, {"w": 3}, TrainStatus(1, tasks_done=(2, 5, 7)))
    assert resume_point(path) == (1, (2, 5, 7))
    save_checkpoint(path, {"w": 4}, TrainStatus(1))
    assert resume_point(path) == (2, ()) and latest_train_status(path) == TrainStatus(1)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"epoch": None, "tasks_done": (1,)}, "needs the epoch"),
    ({"epoch": 0, "tasks_done": (-1,)}, "need task ids >= 0"),
    ({"epoch": 0, "tasks_done": (1, "3")}, "need task ids >= 0"),
])
def test_bad_tasks_done_are_refused_naming_them(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        TrainStatus(**kwargs)
