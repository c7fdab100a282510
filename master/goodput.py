"""Goodput: every trainer-second of a job, productive or lost, and to what (docs/design.md §12).

The master sees every session, task, restart and save-model grant, so it can account the
job's trainer-seconds without anything from the trainers. Once a second the meter looks at
the cache (an `Observation`) and adds the seconds since its last look to one cause per
trainer slot; a slot is a trainer the job should have (the desired size; more while a
scale-down is under way). Trainer ids are counted by their base id (`7` for the loader
workers `7/0`, `7/1`), as the job counts trainers. The causes, as the master sees them:

    productive   a session of the trainer holds a task (it reads the task's records; a task
                 is acknowledged once its records went into batches, so this includes the
                 training of those batches up to the next task)
    startup      no session yet for the slot since the job began: admission, scheduling,
                 image pulls, the program's start, until it registers
    restart      the slot had a trainer, and has none now: a death, a group restart, a
                 resize under way, until the new one registers
    starting     registered but has not held a task yet: the program loads its model or
                 checkpoint, builds its loaders
    checkpoint   holds no task while a save-model grant is live (a checkpoint is being
                 saved; in collective training the group waits for it)
    data_wait    the job's dataset is not known yet (adoption, or a client that brings it)
    straggler    holds no task at an epoch's end while other trainers read the last tasks
    idle         holds no task while tasks are free (the program does something else)
    recomputed   productive seconds whose tasks a restart undid (`RestartEpoch`): the work
                 since the last checkpoint, trained again
    failover     the trainer-seconds between the last figures a master wrote to etcd and
                 the next leader's first look (the job's trainers may have gone on reading)

A task read partly by a trainer that died is read again whole by another: the master
cannot tell how far the first got, so those seconds stay productive.

`productive + every lost cause = trainer slots x wall time`, exactly, by construction of
each sample; the causes are right to within a sample (1 s) per change. The figures are
kept in etcd (`goodput` under the job's prefix, when a master's term begins, every
`PERSIST_EVERY` seconds and when it ends), so a new leader goes on from them.

What this does NOT see: what a trainer does between two calls (a slow step looks like
productive reading), the time before the first master led (a job whose master could not
start), nor trainers that never call the master: a job whose trainers read their own data
shows its slots as `startup` throughout.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

PRODUCTIVE = "productive"
LOST_CAUSES = ("startup", "restart", "starting", "checkpoint", "data_wait", "straggler", "idle",
               "recomputed", "failover")
CAUSES = (PRODUCTIVE, *LOST_CAUSES)
SAMPLE_EVERY = 1.0
PERSIST_EVERY = 5.0
# The figures' history (the status page's plot over the job's life) keeps at most this many
# points: when full, every other point goes, so it always spans the whole life at a coarser
# step; bounded, it rides in the one etcd key with the figures (a few KiB).
HISTORY_POINTS = 240


def base_id(trainer: str) -> str:
    """A trainer's id without a loader worker's `/N`."""
    return trainer.split("/", 1)[0]


@dataclass(frozen=True)
class Observation:
    """What the meter needs of the master's cache at one moment (see `master.dispatcher`)."""

    capacity: int                         # trainer slots the job should have
    running: bool                         # the job is neither finished nor failed
    has_dataset: bool
    epoch: int
    todo: int
    pending: int
    # base trainer id -> the tasks its sessions hold (the task being read first)
    holding: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    saving: bool = False                  # a save-model grant is live
    done: frozenset[int] = frozenset()    # of `GoodputMeter.credited_tasks()`, those counted done
    done_count: int = 0                   # the current epoch's tasks counted done
    num_tasks: int = 0


class GoodputMeter:
    """Integrates observations into trainer-seconds per cause; pure (the caller gives `now`)."""

    def __init__(self, *, now: float) -> None:
        self.totals: Counter[str] = Counter({cause: 0.0 for cause in CAUSES})
        self.ever: set[str] = set()           # base ids that ever had a session
        self.started: set[str] = set()        # ... that ever held a task
        self._last = now
        self._capacity = 0
        self._epoch: int | None = None
        self._credits: dict[int, float] = {}  # the current epoch's productive seconds per task
        self._done_credited: set[int] = set()  # credited tasks that were counted done
        self._epoch_totals: dict[int, float] = {}  # productive seconds per epoch
        self.history: list[tuple[float, tuple[float, ...]]] = []  # (wall, totals in CAUSES order)

    # ---- figures --------------------------------------------------------------------

    @property
    def productive(self) -> float:
        return self.totals[PRODUCTIVE]

    @property
    def lost(self) -> float:
        return sum(self.totals[c] for c in LOST_CAUSES)

    def credited_tasks(self) -> list[int]:
        """The current epoch's tasks with productive seconds (whose done marks it follows)."""
        return list(self._credits)

    def figures(self) -> dict[str, float]:
        return {cause: round(self.totals[cause], 3) for cause in CAUSES}

    # ---- sampling -------------------------------------------------------------------

    def sample(self, obs: Observation, *, now: float) -> None:
        """Adds the seconds since the last sample, classified by `obs`."""
        dt = max(0.0, now - self._last)
        self._last = now
        self._follow_epoch(obs)
        live = set(obs.holding)
        self.ever |= live
        self.started |= {t for t, held in obs.holding.items() if held}
        self._capacity = max(obs.capacity, len(live)) if obs.running else 0
        if dt == 0 or not obs.running:
            return
        for trainer, held in obs.holding.items():
            cause = self._cause(trainer, held, obs)
            self.totals[cause] += dt
            if cause == PRODUCTIVE:
                self._credit(held[0], dt, obs.epoch)
        missing = self._capacity - len(live)
        if missing > 0:
            restarting = min(missing, len(self.ever - live))
            self.totals["restart"] += dt * restarting
            self.totals["startup"] += dt * (missing - restarting)

    def _cause(self, trainer: str, held: tuple[int, ...], obs: Observation) -> str:
        if not obs.has_dataset:
            return "data_wait"
        if held:
            return PRODUCTIVE
        if obs.saving:
            return "checkpoint"
        if trainer not in self.started:
            return "starting"
        if obs.todo == 0 and obs.pending > 0:
            return "straggler"
        return "idle"

    def _credit(self, task: int, seconds: float, epoch: int) -> None:
        self._credits[task] = self._credits.get(task, 0.0) + seconds
        self._epoch_totals[epoch] = self._epoch_totals.get(epoch, 0.0) + seconds

    def _follow_epoch(self, obs: Observation) -> None:
        """Moves the productive seconds a restart undid to `recomputed`."""
        if self._epoch is None:
            self._epoch = obs.epoch
        elif obs.epoch > self._epoch:  # the epoch ended: its work stands
            self._epoch = obs.epoch
            self._credits.clear()
            self._done_credited.clear()
            return
        elif obs.epoch < self._epoch:  # restarted at an earlier epoch
            undone = sum(v for e, v in self._epoch_totals.items() if e > obs.epoch)
            for e in [e for e in self._epoch_totals if e > obs.epoch]:
                del self._epoch_totals[e]
            kept = obs.done_count / obs.num_tasks if obs.num_tasks else 0.0
            earlier = self._epoch_totals.get(obs.epoch, 0.0)
            undone += earlier * (1 - kept)
            self._epoch_totals[obs.epoch] = earlier * kept
            self._undo(undone)
            self._epoch = obs.epoch
            self._credits.clear()
            self._done_credited.clear()
            return
        # the same epoch: a credited task counted done that no longer is was undone
        undone_tasks = [t for t in self._done_credited if t not in obs.done]
        if undone_tasks:
            seconds = sum(self._credits.pop(t, 0.0) for t in undone_tasks)
            self._done_credited.difference_update(undone_tasks)
            self._epoch_totals[obs.epoch] = self._epoch_totals.get(obs.epoch, 0.0) - seconds
            self._undo(seconds)
        self._done_credited |= {t for t in self._credits if t in obs.done}

    def _undo(self, seconds: float) -> None:
        seconds = min(seconds, self.totals[PRODUCTIVE])
        self.totals[PRODUCTIVE] -= seconds
        self.totals["recomputed"] += seconds

    # ---- history ----------------------------------------------------------------------

    def mark(self, *, wall: float) -> None:
        """Adds the figures now to the history (thinned to every other point when full; the
        first and the newest stay)."""
        self.history.append((wall, tuple(round(self.totals[c], 1) for c in CAUSES)))
        if len(self.history) > HISTORY_POINTS:
            first, *middle, newest = self.history
            self.history = [first, *middle[1::2], newest]

    def history_figures(self) -> list[tuple[float, dict[str, float]]]:
        """The history as (wall time, cumulative seconds by cause), oldest first."""
        return [(wall, dict(zip(CAUSES, values, strict=True))) for wall, values in self.history]

    # ---- persistence ------------------------------------------------------------------

    def to_json(self, *, wall: float) -> str:
        """What a next leader needs to go on: totals, the slots seen, and when and how many,
        and the history."""
        return json.dumps({"totals": self.figures(), "ever": sorted(self.ever),
                           "started": sorted(self.started), "capacity": self._capacity,
                           "at": wall, "history": [[w, list(v)] for w, v in self.history]},
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: bytes | str | None, *, now: float, wall: float) -> GoodputMeter:
        """A meter that goes on from a predecessor's figures; the trainer-seconds between
        their writing and now count as `failover` (at the capacity then)."""
        meter = cls(now=now)
        if not raw:
            return meter
        saved = json.loads(raw)
        meter.totals.update({c: float(v) for c, v in saved.get("totals", {}).items() if c in CAUSES})
        meter.ever = set(saved.get("ever", ()))
        meter.started = set(saved.get("started", ()))
        gap = max(0.0, wall - float(saved.get("at", wall)))
        meter.totals["failover"] += gap * int(saved.get("capacity", 0))
        meter.history = [(float(w), tuple(float(x) for x in v)) for w, v in saved.get("history", ())
                         if len(v) == len(CAUSES)]  # a history of other causes is not drawn
        return meter


def holding_by_trainer(sessions: Iterable[tuple[str, int]],
                       held: Mapping[int, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Base trainer id -> the tasks its sessions hold, from (trainer id, session) pairs."""
    out: dict[str, tuple[int, ...]] = {}
    for trainer, session in sessions:
        key = base_id(trainer)
        out[key] = out.get(key, ()) + tuple(held.get(session, ()))
    return out


def wall_clock() -> float:
    return time.time()
