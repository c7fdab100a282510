"""The job's phases: one enum for the master, the deployers, the agents and the CLI.

The same words as paddle-operator's PaddleJob phases where they overlap; the string
value is what etcd's `phase` key, the Deployment annotation and GetStatus carry.
"""

from __future__ import annotations

import enum


class Phase(str, enum.Enum):
    PENDING = "Pending"
    STARTING = "Starting"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    @property
    def rank(self) -> int:
        """Phases only move forward: a phase never replaces one of higher rank."""
        return _RANK[self]

    def __str__(self) -> str:
        return self.value


TERMINAL = frozenset({Phase.SUCCEEDED, Phase.FAILED})
_RANK = {Phase.PENDING: 0, Phase.STARTING: 1, Phase.RUNNING: 2, Phase.SUCCEEDED: 3, Phase.FAILED: 3}
