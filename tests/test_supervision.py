"""The one decision of a job's end, `decide_phase`, over the table of its cases (pure, no I/O)."""

from __future__ import annotations

import pytest

from paddlecloud.deployer import RoleStatus
from paddlecloud.phase import Phase
from paddlecloud.supervision import Graces, MasterState, decide_phase

pytestmark = pytest.mark.unit

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


def check(master: MasterState, trainers: RoleStatus, phase: Phase, hold: float, reason: str) -> None:
    verdict = decide_phase(master, trainers, graces=GRACES)
    assert (verdict.phase, verdict.hold) == (phase, hold)
    assert reason in verdict.reason
    assert bool(verdict.reason) == (phase != Phase.RUNNING)  # an end always says why


@pytest.mark.parametrize("trainers", [RUNNING, FINISHED, GAVE_UP, NOT_CREATED])
def test_failed_data_fails_the_job_whatever_the_trainers_do(trainers):
    check(FAILED, trainers, Phase.FAILED, 0.0, "every task of an epoch failed")


@pytest.mark.parametrize("trainers", [FINISHED, FINISHED_AFTER_FAILURES, NOT_CREATED])
def test_done_data_succeeds_once_no_trainer_runs(trainers):
    check(DONE, trainers, Phase.SUCCEEDED, 0.0, "the data is done")


@pytest.mark.parametrize("trainers", [RUNNING, ONE_EXITED])
def test_done_data_with_trainers_still_running_succeeds_after_the_done_grace(trainers):
    check(DONE, trainers, Phase.SUCCEEDED, GRACES.done, "still running")


def test_done_data_with_trainers_given_up_fails():
    check(DONE, GAVE_UP, Phase.FAILED, 0.0, "the data is done but the trainers failed")


@pytest.mark.parametrize("master", [DATA, NO_DATASET])
def test_trainers_given_up_fail_the_job_and_say_why(master):
    check(master, GAVE_UP, Phase.FAILED, 0.0, "trainer 1 exited with 1")


def test_trainers_exiting_0_before_the_data_is_done_fail_the_job_after_the_exited_grace():
    check(DATA, FINISHED, Phase.FAILED, GRACES.exited, "did not consume its data")


def test_without_a_dataset_trainers_exiting_0_succeed():
    check(NO_DATASET, FINISHED, Phase.SUCCEEDED, 0.0, "no dataset")


@pytest.mark.parametrize("master, trainers", [
    (DATA, RUNNING), (DATA, ONE_EXITED), (DATA, REPLACING), (DATA, NOT_CREATED),
    (NO_DATASET, RUNNING),
])
def test_otherwise_the_job_runs(master, trainers):
    check(master, trainers, Phase.RUNNING, 0.0, "")


def test_role_status_gave_up_only_when_nothing_is_left_to_try():
    assert GAVE_UP.gave_up and not REPLACING.gave_up and not FINISHED_AFTER_FAILURES.gave_up
    assert not NOT_CREATED.gave_up and not NOT_CREATED.finished


def test_graces_refuse_negative_seconds():
    with pytest.raises(ValueError, match="done=-1s"):
        Graces(done=-1)


OWN_DATA = MasterState(has_dataset=True, tasks_assigned=False)  # no trainer took a task


def test_trainers_exiting_0_that_never_took_a_task_succeed_after_the_exited_grace():
    # docs/design.md section 12: a job that brings its own data ends by its trainers' exits
    check(OWN_DATA, FINISHED, Phase.SUCCEEDED, GRACES.exited, "none took a task")


@pytest.mark.parametrize("trainers, phase", [(GAVE_UP, Phase.FAILED), (RUNNING, Phase.RUNNING),
                                             (ONE_EXITED, Phase.RUNNING)])
def test_a_job_with_its_own_data_still_fails_or_runs_by_its_trainers(trainers, phase):
    assert decide_phase(OWN_DATA, trainers, graces=GRACES).phase == phase
