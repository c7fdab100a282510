"""The etcd key names of a job: one place, shared by the master, the agents and the CLI.

Every key of a job lives under `/paddlecloud/<namespace>/<job>/` (docs/design.md section 6).
"""

from __future__ import annotations

from dataclasses import dataclass

ROOT = "/paddlecloud/"


def prefix_range_end(prefix: bytes) -> bytes:
    """The etcd range end that covers every key starting with `prefix`."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"


@dataclass(frozen=True)
class JobKeys:
    namespace: str
    job: str

    @property
    def prefix(self) -> bytes:
        return f"{ROOT}{self.namespace}/{self.job}/".encode()

    def _key(self, *parts: object) -> bytes:
        return self.prefix + "/".join(str(p) for p in parts).encode()

    # Job-wide keys.
    @property
    def spec(self) -> bytes:
        return self._key("spec")

    @property
    def epoch(self) -> bytes:
        return self._key("epoch")

    @property
    def phase(self) -> bytes:
        return self._key("phase")

    @property
    def leader(self) -> bytes:
        return self._key("leader")

    @property
    def goodput(self) -> bytes:
        """The job's trainer-seconds by cause (master.goodput), as its last leader wrote them."""
        return self._key("goodput")

    def master(self, advertise: str) -> bytes:
        """A master's presence, leader or standby: on its own election session's lease, value
        JSON `{"advertise", "page", "started"}`; present = alive. Not job state (written unfenced)."""
        return self._key("masters", advertise)

    @property
    def trainers_range(self) -> bytes:
        """The job's trainer range, JSON `{"min": N, "max": M}` (written once)."""
        return self._key("trainers-range")

    @property
    def trainers_desired(self) -> bytes:
        """The trainer group's desired size, within the range (`ScaleTrainers` changes it)."""
        return self._key("trainers-desired")

    @property
    def save_model(self) -> bytes:
        return self._key("save-model")

    def files(self, piece: int) -> bytes:
        return self._key("files", f"{piece:06d}")

    # Per-trainer and per-task keys; a `*_prefix` covers all of one kind.
    def trainer(self, trainer_id: str) -> bytes:
        return self._key("trainers", trainer_id)

    def superseded(self, session_id: int) -> bytes:
        return self._key("superseded", session_id)

    def assign(self, task: int) -> bytes:
        return self._key("assign", task)

    def done(self, epoch: int, task: int) -> bytes:
        return self._key("done", epoch, task)

    def failures(self, epoch: int, task: int) -> bytes:
        return self._key("failures", epoch, task)

    def extent(self, epoch: int, unit: int) -> bytes:
        """The bytes of its root task a unit owns in `epoch` once work stealing cut it (a split
        task, or a piece split off one: master.stealing); JSON `{"task", "lo", "hi"}`."""
        return self._key("extents", epoch, unit)

    def pserver(self, index: int) -> bytes:
        """A pserver's registration: on its agent's lease, value `HOST:PORT`; present = alive."""
        return self._key("pservers", index)

    def pserver_slot(self, index: int) -> bytes:
        """The endpoint pserver slot `index` keeps for the life of the job: written once, no lease."""
        return self._key("pserver-slots", index)

    def kind_prefix(self, kind: str, epoch: int | None = None) -> bytes:
        """`kind_prefix("done", 3)` covers `done/3/*`; `kind_prefix("assign")` covers `assign/*`."""
        return self._key(kind, "") if epoch is None else self._key(kind, epoch, "")

    def task_of(self, key: bytes) -> int:
        """The task id at the end of an `assign/`, `done/` or `failures/` key."""
        return int(key.rsplit(b"/", 1)[1])
