"""Trainer sessions as the master sees them: an etcd lease per session, in a registry.

The registry is the sessions' part of the master's one machine
(`master.machine.MasterMachine`): only its `apply` changes it, and it reads no clock
(a call's time comes in its event). Refreshing the leases is the trainers room's
(`master.trainers`).

The master grants a lease when a trainer registers and refreshes it only when the
trainer calls (KeepAlive, or any RPC carrying its session): it never keeps a lease
alive on its own, so a dead trainer's lease lapses and etcd itself deletes its
`trainers/<id>` and `assign/<task>` keys. A piggybacked refresh is skipped when the
last one is younger than ttl/6, and it is only sent, not waited for (the call goes on
at once; a lease that had lapsed shows in the watch of `trainers/<id>` keys instead);
an explicit KeepAlive always refreshes and waits for etcd's answer.

A superseded session (its trainer id registered again) is remembered on the new
session's lease, so the answer "superseded" survives a master failover and lapses
with the newer session. An evicted session (the operator's `EvictTrainer`) is told
"evicted", which a trainer takes as a supersede (it stops); that is remembered by this
master only (EVICTED_REMEMBERED of them): after a failover its trainer hears "expired"
and may register again.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass

from paddlecloud.untrusted import quote


class SessionExpired(Exception):
    """Unknown or expired session: the trainer should register again."""

    def __init__(self, session: int) -> None:
        super().__init__(f"session {session} expired: register again")
        self.session = session


class SessionSuperseded(Exception):
    """The trainer id has a newer session: this process must stop."""

    def __init__(self, session: int, trainer: str) -> None:
        super().__init__(f"session {session} superseded by a newer session of trainer {trainer}")
        self.session = session
        self.trainer = trainer


class SessionEvicted(SessionSuperseded):
    """The operator evicted the session (`EvictTrainer`): this process must stop, as when superseded."""

    def __init__(self, session: int, trainer: str) -> None:
        super().__init__(session, trainer)
        self.args = (f"session {session} of trainer {trainer} was evicted by the operator: stop",)


class UnknownTrainer(Exception):
    """An operator named a trainer id that has no session."""


class TooManySessions(Exception):
    """A registration past the job's session cap (`session_cap_refusal`): RESOURCE_EXHAUSTED."""


# The session cap. A job's trainers are at most its range's maximum, but honest sessions can
# outnumber that for a while: a trainer replaced under a new id (a new pod name) while its
# old session lives out its TTL, a tool that registers beside them. So the cap on trainer
# ids is the maximum plus a margin of as many again (at least CAP_MARGIN_MIN). A DataLoader's
# worker processes register ids `BASE/N` (`trainer_agent.paddle`): they count as their
# trainer BASE, and one trainer holds at most LOADER_SESSIONS of them (its workers and itself).
CAP_MARGIN_MIN = 4
LOADER_SESSIONS = 257  # trainer_agent.paddle.MAX_WORKERS loader workers, and the trainer


def trainer_base(trainer: str) -> str:
    """The trainer a session's id belongs to: `7` for a loader worker's `7/0`."""
    return trainer.partition("/")[0]


def trainer_cap(maximum: int) -> int:
    """Trainer ids (loader workers counted as their trainer) a job of at most `maximum` trainers
    may have sessions for at once."""
    return maximum + max(CAP_MARGIN_MIN, maximum)


def session_cap_refusal(trainer: str, *, trainers: int, new_trainer: bool, sessions_of_trainer: int,
                        maximum: int) -> str | None:
    """Why a new session of `trainer` (an id with no session yet: an id that has one supersedes
    it and never counts twice) would pass the cap of a job of at most `maximum` trainers, given the
    `trainers` (ids less their `/N`) with sessions now, whether `trainer`'s is `new_trainer`
    among them, and the `sessions_of_trainer` its trainer has; None when it may register."""
    cap = trainer_cap(maximum)
    if new_trainer and trainers >= cap:
        return (f"trainer {quote(trainer)} refused: the job has sessions of {trainers} trainers, "
                f"its cap ({cap}: max_trainers {maximum} plus a margin of {cap - maximum}); "
                "one frees when a trainer leaves or its session expires")
    if sessions_of_trainer >= LOADER_SESSIONS:
        return (f"trainer {quote(trainer)} refused: trainer {quote(trainer_base(trainer))} has "
                f"{sessions_of_trainer} sessions (itself and its loader workers), the cap of one "
                f"trainer ({LOADER_SESSIONS})")
    return None


EVICTED_REMEMBERED = 4096  # evicted sessions told so (the rest hear "expired")


@dataclass
class SessionInfo:
    session: int
    trainer: str
    last_call: float = 0.0      # monotonic seconds of its last call (0: none since loaded)
    last_refresh: float = 0.0   # and of its lease's last refresh


class SessionRegistry:
    """The live sessions, and the ended ones a late call is told about; changed only by
    `master.machine.MasterMachine.apply`."""

    def __init__(self) -> None:
        self.by_session: dict[int, SessionInfo] = {}
        self.by_trainer: dict[str, int] = {}
        self.superseded: dict[int, str] = {}
        self.evicted: OrderedDict[int, str] = OrderedDict()  # session -> trainer, the newest last
        self.bases: Counter[str] = Counter()  # trainer_base -> its ids with a session (the cap counts them)

    def load(self, trainers: dict[str, int], superseded: dict[int, str], *, at: float) -> None:
        """The sessions etcd holds, as of `at` (their last call: they get a TTL from the load)."""
        self.by_session = {sid: SessionInfo(sid, tid, last_call=at) for tid, sid in trainers.items()}
        self.by_trainer = dict(trainers)
        self.bases = Counter(trainer_base(t) for t in trainers)
        self.superseded = dict(superseded)

    def add(self, trainer: str, session: int, *, supersedes: int | None, at: float) -> None:
        """Records a new session of `trainer` opened at `at`, and the older session it replaced."""
        if supersedes is not None:
            self.by_session.pop(supersedes, None)
            self.superseded[supersedes] = trainer
        if trainer not in self.by_trainer:
            self.bases[trainer_base(trainer)] += 1
        self.by_trainer[trainer] = session
        self.by_session[session] = SessionInfo(session, trainer, last_call=at, last_refresh=at)

    def called(self, session: int, *, at: float, refreshed: bool) -> None:
        """`session` called at `at` (and its lease was refreshed then, if `refreshed`)."""
        info = self.by_session[session]
        info.last_call = at
        if refreshed:
            info.last_refresh = at

    def mark_superseded(self, session: int, trainer: str) -> None:
        """`session` is being replaced by a newer one of `trainer`: from now on it is told
        so (not "expired") — also while the newer one's registration is still being written."""
        self.superseded[session] = trainer

    def mark_evicted(self, session: int, trainer: str) -> None:
        """`session` is being ended by the operator: from now on it is told so."""
        self.evicted[session] = trainer
        if len(self.evicted) > EVICTED_REMEMBERED:
            self.evicted.popitem(last=False)

    def remove(self, session: int) -> SessionInfo | None:
        info = self.by_session.pop(session, None)
        if info is not None and self.by_trainer.get(info.trainer) == session:
            del self.by_trainer[info.trainer]
            base = trainer_base(info.trainer)
            self.bases[base] -= 1
            if not self.bases[base]:
                del self.bases[base]
        return info

    def forget_superseded_by(self, session: int) -> None:
        """`session` ended: the superseded markers on its lease lapse with it — its trainer's
        older sessions', not its own (superseded itself, its marker is on the newer lease)."""
        info = self.by_session.get(session)
        if info is None:
            return
        for old, trainer in list(self.superseded.items()):
            if trainer == info.trainer and old != session:
                del self.superseded[old]

    def check(self, session: int) -> SessionInfo:
        info = self.by_session.get(session)
        if info is not None:
            return info
        if session in self.superseded:
            raise SessionSuperseded(session, self.superseded[session])
        if session in self.evicted:
            raise SessionEvicted(session, self.evicted[session])
        raise SessionExpired(session)
