"""The one decision of a job's end, `decide_phase`, over the table of its cases (pure, no I/O)."""

from __future__ import annotations

import pytest

from paddlecloud.deployer import RoleStatus
from paddlecloud.phase import Phase
from paddlecloud.supervision import Graces, MasterState, decide_phase

GRACES = Graces(done=30.0, exited=5.0)
RUNNING = RoleStatus(desired=2, active=2)
ONE_EXITED = RoleStatus(desired=2, active=1, succeeded=1)
FINISHED = RoleStatus(desired=2, succeeded=2)
GAVE_UP = RoleStatus(desired=2, failed=3, detail="trainer 1 exited with 1")
REPLACING = RoleStatus(desired=2, active=1, succeeded=1, failed=1)  # a failed pod being replaced
FINISHED_AFTER_FAILURES = RoleStatus(desired=2, succeeded=2, failed=4)
NOT_CREATED = RoleStatus(desired=2)

DATA = MasterState(has_dataset=True)
DONE = MasterState(has_dataset=True, done=True)
FAILED = MasterState(has_dataset=True, failed=True)
NO_DATASET = MasterState(has_dataset=False)


@pytest.mark.parametrize("master, trainers, phase, hold, reason", [
    # the master's data failed: whatever the trainers do
    (FAILED, RUNNING, Phase.FAILED, 0.0, "every task of an epoch failed"),
    (FAILED, FINISHED, Phase.FAILED, 0.0, "every task of an epoch failed"),
    # the data is done
    (DONE, FINISHED, Phase.SUCCEEDED, 0.0, "the data is done"),
    (DONE, FINISHED_AFTER_FAILURES, Phase.SUCCEEDED, 0.0, "the data is done"),
    (DONE, NOT_CREATED, Phase.SUCCEEDED, 0.0, "no trainer runs"),
    (DONE, GAVE_UP, Phase.FAILED, 0.0, "the data is done but the trainers failed"),
    (DONE, RUNNING, Phase.SUCCEEDED, GRACES.done, "still running"),
    (DONE, ONE_EXITED, Phase.SUCCEEDED, GRACES.done, "still running"),
    # the data is not done
    (DATA, GAVE_UP, Phase.FAILED, 0.0, "trainer 1 exited with 1"),
    (DATA, FINISHED, Phase.FAILED, GRACES.exited, "did not consume its data"),
    (NO_DATASET, FINISHED, Phase.SUCCEEDED, 0.0, "no dataset"),
    (NO_DATASET, GAVE_UP, Phase.FAILED, 0.0, "the trainers failed"),
    (DATA, RUNNING, Phase.RUNNING, 0.0, ""),
    (DATA, ONE_EXITED, Phase.RUNNING, 0.0, ""),
    (DATA, REPLACING, Phase.RUNNING, 0.0, ""),
    (DATA, NOT_CREATED, Phase.RUNNING, 0.0, ""),
    (NO_DATASET, RUNNING, Phase.RUNNING, 0.0, ""),
])
def test_decide_phase(master, trainers, phase, hold, reason):
    verdict = decide_phase(master, trainers, graces=GRACES)
    assert (verdict.phase, verdict.hold) == (phase, hold)
    assert reason in verdict.reason
    assert bool(verdict.reason) == (phase != Phase.RUNNING)  # an end always says why


def test_role_status_gave_up_only_when_nothing_is_left_to_try():
    assert GAVE_UP.gave_up and not REPLACING.gave_up and not FINISHED_AFTER_FAILURES.gave_up
    assert not NOT_CREATED.gave_up and not NOT_CREATED.finished


def test_graces_refuse_negative_seconds():
    with pytest.raises(ValueError, match="done=-1s"):
        Graces(done=-1)
