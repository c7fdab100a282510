"""How a process's end is told: exit codes from signals, and one line for people.

Every supervisor of this project (the trainer launcher, the pserver agent and its
supervisor, the local job) exits with its child's code, shell style: a child killed by
signal N is 128+N, as `sh` reports it and as Kubernetes shows it (137 for SIGKILL).
`returncode` here is what `subprocess`/`asyncio` give: the exit status, or -N for a
death by signal N.

What this does NOT do: tell a code 128+N that a process chose to exit with from a real
death by signal N; only a `returncode` says which it was.
"""

from __future__ import annotations

import signal

# The seconds a stopped process may take to drain to a checkpoint before it gives up
# (trainer_agent.termination); each backend sets it below the time it waits before SIGKILL.
STOP_GRACE_ENV = "PADDLECLOUD_STOP_GRACE"


def signal_exit_code(signum: int) -> int:
    """The exit code a shell reports for a death by signal `signum`: 128 + signum."""
    return 128 + signum


def exit_code(returncode: int) -> int:
    """A child's `returncode` as a shell reports it (a death by signal N is 128+N)."""
    return signal_exit_code(-returncode) if returncode < 0 else returncode


# Signals a process raises on itself: SIGABRT is abort() (a C++ `terminate called`, gloo's
# IoException once a peer vanished), the others a crash. Nobody killed such a process, so its
# end is not told as "killed by".
ABORT_SIGNALS = frozenset({signal.SIGABRT})
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE})


def describe_exit(returncode: int) -> str:
    """`exited with 3`, `killed by SIGKILL` for a `returncode` of -9, `aborted (SIGABRT)` for
    -6 and `crashed (SIGSEGV)` for -11: "killed by" only where something else sent the signal."""
    if returncode >= 0:
        return f"exited with {returncode}"
    try:
        sig = signal.Signals(-returncode)
    except ValueError:
        return f"killed by signal {-returncode}"
    if sig in ABORT_SIGNALS:
        return f"aborted ({sig.name})"
    if sig in CRASH_SIGNALS:
        return f"crashed ({sig.name})"
    return f"killed by {sig.name}"
