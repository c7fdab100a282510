"""The interface between the master and whatever runs the job's processes.

The leading master drives a `Deployer` through the job's phases (see
`master.deployment`): pservers first, trainers once every pserver has registered
in etcd, clean-up when the trainers end. The Kubernetes backend implements it with
a StatefulSet and an Indexed Job; the local backend with child processes.

A Deployer must be idempotent: a master that took over from a dead leader calls the
same methods again, and objects that already exist are adopted, not duplicated.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass


@dataclass(frozen=True)
class RoleStatus:
    """What the backend sees of one role's processes (pods or child processes)."""

    desired: int
    active: int = 0
    succeeded: int = 0
    failed: int = 0

    @property
    def finished(self) -> bool:
        return self.desired > 0 and self.succeeded >= self.desired


class Deployer(abc.ABC):
    """Creates, observes and removes the pservers and trainers of one job."""

    @abc.abstractmethod
    async def create_pservers(self) -> None:
        """Creates the pservers (no-op when the job has none, or they exist)."""

    @abc.abstractmethod
    async def create_trainers(self) -> None:
        """Creates the trainers; only called once every pserver has registered."""

    @abc.abstractmethod
    async def trainer_status(self) -> RoleStatus:
        """The trainers as the backend sees them now."""

    @abc.abstractmethod
    async def cleanup(self, *, succeeded: bool) -> None:
        """Removes what the job's clean-pod policy says should go when the job ends."""
