"""Exit codes from signals, and how a process's end is told (paddlecloud.exits)."""

from __future__ import annotations

import signal

import pytest

from paddlecloud.exits import describe_exit, exit_code, signal_exit_code

pytestmark = pytest.mark.unit


def test_a_death_by_signal_is_128_plus_n_as_a_shell_reports_it():
    assert signal_exit_code(signal.SIGTERM) == 143
    assert exit_code(-signal.SIGKILL) == 137
    assert exit_code(0) == 0 and exit_code(3) == 3


def test_an_end_is_told_in_words():
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(-signal.SIGTERM) == "killed by SIGTERM"
    assert describe_exit(3) == "exited with 3"
    assert describe_exit(-99) == "killed by signal 99"


def test_a_process_that_aborted_or_crashed_itself_is_not_told_as_killed():
    # gloo's abort once its peer vanished is the trainer's own abort(), not a kill
    assert describe_exit(-signal.SIGABRT) == "aborted (SIGABRT)"
    assert describe_exit(-signal.SIGSEGV) == "crashed (SIGSEGV)"
    assert describe_exit(-signal.SIGBUS) == "crashed (SIGBUS)"
