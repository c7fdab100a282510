"""paddlecloud.fleet_ps without Paddle: its checkpoints are paddlecloud's, and restores pick the newest."""

from __future__ import annotations

import pytest

from paddlecloud import checkpoints, fleet_ps
from paddlecloud.deployer import PSERVER_RESTORE_ENV

pytestmark = pytest.mark.unit


class _Fleet:
    """Records what fleet_ps asks of Paddle's fleet; `save_persistables` writes a table file."""

    def __init__(self) -> None:
        self.loaded: list[tuple[str, int]] = []

    def save_persistables(self, executor, dirname: str) -> None:
        from pathlib import Path

        Path(dirname).mkdir(parents=True)
        (Path(dirname) / "table-0").write_text("shard")

    def load_model(self, path: str, mode: int) -> None:
        self.loaded.append((path, mode))


def test_the_format_written_without_fsspec_is_the_one_paddlecloud_reads(tmp_path):
    assert (fleet_ps.CHECKPOINTS_DIR, fleet_ps.STATE_FILE, fleet_ps.META_FILE, fleet_ps.FORMAT_VERSION) == (
        checkpoints.CHECKPOINTS_DIR, checkpoints.STATE_FILE, checkpoints.META_FILE, checkpoints.FORMAT_VERSION)
    assert fleet_ps.RESTORE_ENV == PSERVER_RESTORE_ENV
    fleet = _Fleet()
    for epoch in range(3):
        fleet_ps.save_checkpoint(fleet, None, output=str(tmp_path), epoch=epoch)
    where = checkpoints.checkpoints_dir(str(tmp_path))
    assert checkpoints.resume_point(where) == (3, ())  # the master restarts the epoch after it
    kept = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert kept == ["checkpoint-00000001", "checkpoint-00000002"]  # keep=2, their tables too
    assert sorted(p.name for p in (tmp_path / "ps-tables").iterdir()) == ["epoch-00000001", "epoch-00000002"]


def test_restore_loads_the_newest_tables_only_when_told(tmp_path, monkeypatch):
    fleet = _Fleet()
    fleet_ps.save_checkpoint(fleet, None, output=str(tmp_path), epoch=0)
    fleet_ps.save_checkpoint(fleet, None, output=str(tmp_path), epoch=1)
    monkeypatch.delenv(PSERVER_RESTORE_ENV, raising=False)
    assert fleet_ps.restore(fleet, output=str(tmp_path)) is None and fleet.loaded == []
    monkeypatch.setenv(PSERVER_RESTORE_ENV, "1")
    assert fleet_ps.restore(fleet, output=str(tmp_path)) == 1
    assert fleet.loaded == [(str(tmp_path / "ps-tables" / "epoch-00000001"), 0)]


def test_a_torn_newest_checkpoint_falls_back_to_the_one_before(tmp_path):
    fleet = _Fleet()
    fleet_ps.save_checkpoint(fleet, None, output=str(tmp_path), epoch=0)
    fleet_ps.save_checkpoint(fleet, None, output=str(tmp_path), epoch=1)
    (tmp_path / "checkpoints" / "checkpoint-00000001" / "state.pkl").write_bytes(b"torn")
    assert fleet_ps.newest_tables(str(tmp_path)) == (0, str(tmp_path / "ps-tables" / "epoch-00000000"))


class _Handle:
    def __init__(self) -> None:
        self.pushed = False

    def _init_all_params(self, *args):
        self.pushed = True


class _InitFleet:
    def __init__(self) -> None:
        self.fleet = self
        self._runtime_handle = _Handle()

    def init_worker(self) -> None:
        self._runtime_handle._init_all_params()


@pytest.mark.parametrize(("live", "pushed"), [("1", False), ("", True)])
def test_trainer_0_pushes_fresh_parameters_only_while_the_pservers_hold_no_model(monkeypatch, live, pushed):
    monkeypatch.setenv(fleet_ps.MODEL_LIVE_ENV, live)
    fleet = _InitFleet()
    assert fleet_ps.init_worker(fleet) is (not pushed)
    assert fleet._runtime_handle.pushed is pushed
    assert fleet._runtime_handle._init_all_params.__func__ is _Handle._init_all_params  # put back
