"""Checkpoints: round trips, pruning, torn and half-written versions, SIGKILL mid-save."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import fsspec
import pytest

from trainer_agent import checkpoint
from trainer_agent.checkpoint import (
    CheckpointError,
    TrainStatus,
    latest_train_status,
    load_checkpoint,
    save_checkpoint,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(params=["local", "memory"])
def ckpt_dir(request, tmp_path):
    """A checkpoint directory that does not exist yet, on a local disk or in memory://."""
    if request.param == "local":
        yield str(tmp_path / "ckpt")
        return
    url = f"memory://ckpt-tests/{uuid.uuid4().hex}"
    yield url
    fs = fsspec.filesystem("memory")
    if fs.exists(url):
        fs.rm(url, recursive=True)


def _names(path: str) -> list[str]:
    fs, root = fsspec.core.url_to_fs(path)
    return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False))


def _put(path: str, name: str, files: dict[str, bytes]) -> None:
    fs, root = fsspec.core.url_to_fs(path)
    fs.makedirs(f"{root}/{name}", exist_ok=True)
    for file, data in files.items():
        fs.pipe(f"{root}/{name}/{file}", data)


# --- TrainStatus -----------------------------------------------------------------------


@pytest.mark.unit
def test_train_status_next_is_the_epoch_to_resume_at():
    assert TrainStatus(3).next() == 4
    assert TrainStatus(0).next() == 1


@pytest.mark.unit
def test_train_status_without_an_epoch_starts_at_epoch_0(tmp_path):
    assert TrainStatus().next() == 0  # as EDL's users write it
    assert TrainStatus().epoch is None
    with pytest.raises(ValueError, match=r"cannot save TrainStatus\(\) with no finished epoch"):
        save_checkpoint(str(tmp_path / "ckpt"), {}, TrainStatus())
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").iterdir())


@pytest.mark.unit
@pytest.mark.parametrize("bad", [-1, True, 1.5, "2"])
def test_train_status_rejects_bad_epochs(bad):
    with pytest.raises(ValueError, match=f"epoch {bad!r}"):
        TrainStatus(bad)


# --- round trips and pruning -----------------------------------------------------------


@pytest.mark.unit
def test_round_trip(ckpt_dir):
    state = {"weights": [1.5, 2.5], "blob": b"\x00" * 1000, "nested": {"step": 7}}
    version = save_checkpoint(ckpt_dir, state, TrainStatus(2))
    assert version == f"{ckpt_dir}/checkpoint-00000002"
    assert load_checkpoint(ckpt_dir) == (state, TrainStatus(2))
    assert latest_train_status(ckpt_dir) == TrainStatus(2)
    meta = json.loads(fsspec.open(f"{version}/meta.json").open().read())
    assert meta["epoch"] == 2 and meta["format_version"] == 1 and meta["time"] > 0
    assert _names(ckpt_dir) == ["checkpoint-00000002"]  # no temp dir left behind


@pytest.mark.unit
def test_the_newest_epoch_wins_and_keep_prunes(ckpt_dir):
    for epoch in range(5):
        save_checkpoint(ckpt_dir, {"epoch": epoch}, TrainStatus(epoch), keep=2)
    assert _names(ckpt_dir) == ["checkpoint-00000003", "checkpoint-00000004"]
    assert load_checkpoint(ckpt_dir) == ({"epoch": 4}, TrainStatus(4))


@pytest.mark.unit
def test_saving_an_older_epoch_keeps_it_but_loads_the_newest(ckpt_dir):
    save_checkpoint(ckpt_dir, {"epoch": 5}, TrainStatus(5), keep=1)
    version = save_checkpoint(ckpt_dir, {"epoch": 2}, TrainStatus(2), keep=1)
    assert _names(ckpt_dir) == ["checkpoint-00000002", "checkpoint-00000005"]
    assert version.endswith("checkpoint-00000002")
    assert load_checkpoint(ckpt_dir) == ({"epoch": 5}, TrainStatus(5))


@pytest.mark.unit
def test_resaving_an_epoch_replaces_it(ckpt_dir):
    save_checkpoint(ckpt_dir, {"v": "old"}, TrainStatus(1))
    save_checkpoint(ckpt_dir, {"v": "new"}, TrainStatus(1))
    assert load_checkpoint(ckpt_dir) == ({"v": "new"}, TrainStatus(1))
    assert _names(ckpt_dir) == ["checkpoint-00000001"]


@pytest.mark.unit
def test_bad_arguments_name_the_value(ckpt_dir):
    with pytest.raises(ValueError, match="keep=0"):
        save_checkpoint(ckpt_dir, {}, TrainStatus(1), keep=0)
    with pytest.raises(TypeError, match="list"):
        save_checkpoint(ckpt_dir, [1, 2], TrainStatus(1))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="train_status"):
        save_checkpoint(ckpt_dir, {}, 1)  # type: ignore[arg-type]
    assert load_checkpoint(ckpt_dir) is None  # nothing was written


# --- what load must never pick ---------------------------------------------------------


@pytest.mark.unit
def test_missing_or_empty_dir_has_no_checkpoint(ckpt_dir):
    assert load_checkpoint(ckpt_dir) is None
    assert latest_train_status(ckpt_dir) is None
    fs, root = fsspec.core.url_to_fs(ckpt_dir)
    fs.makedirs(root, exist_ok=True)
    assert load_checkpoint(ckpt_dir) is None
    assert latest_train_status(ckpt_dir) is None


@pytest.mark.unit
def test_temp_and_torn_versions_are_ignored(ckpt_dir):
    save_checkpoint(ckpt_dir, {"good": True}, TrainStatus(1))
    state = b"\x80\x05}\x94."  # a pickled {} of 5 bytes

    def meta(epoch: int) -> bytes:
        fields = {"format_version": 1, "epoch": epoch, "time": 0, "state_bytes": 5}
        return json.dumps(fields).encode()

    now_ms = int(time.time() * 1000)
    _put(ckpt_dir, f".tmp-{now_ms}-abc", {"state.pkl": state, "meta.json": meta(9)})
    _put(ckpt_dir, "checkpoint-00000009", {"state.pkl": state})  # no meta.json
    _put(ckpt_dir, "checkpoint-00000008", {"state.pkl": state[:3], "meta.json": meta(8)})
    _put(ckpt_dir, "checkpoint-00000007", {"state.pkl": state, "meta.json": b"{trunc"})
    _put(ckpt_dir, "checkpoint-00000006", {"state.pkl": state, "meta.json": meta(5)})
    assert load_checkpoint(ckpt_dir) == ({"good": True}, TrainStatus(1))
    assert latest_train_status(ckpt_dir) == TrainStatus(1)


@pytest.mark.unit
def test_stale_temp_dirs_are_deleted_fresh_ones_kept(ckpt_dir):
    now_ms = int(time.time() * 1000)
    stale = f".tmp-{now_ms - int(checkpoint.STALE_TMP_SECONDS * 1000) - 1000}-dead"
    fresh = f".tmp-{now_ms}-beef"
    _put(ckpt_dir, stale, {"state.pkl": b"x"})
    _put(ckpt_dir, fresh, {"state.pkl": b"x"})
    save_checkpoint(ckpt_dir, {}, TrainStatus(0))
    assert _names(ckpt_dir) == [fresh, "checkpoint-00000000"]


@pytest.mark.unit
def test_a_crash_between_the_renames_keeps_the_old_version_loadable(ckpt_dir, monkeypatch):
    save_checkpoint(ckpt_dir, {"v": "older"}, TrainStatus(3))
    save_checkpoint(ckpt_dir, {"v": "old"}, TrainStatus(4))
    real_rename = checkpoint._rename
    calls = []

    def rename_then_crash(fs, src, dst):
        calls.append(dst)
        if len(calls) == 2:  # the old version is aside, the new one not yet in place
            raise OSError("simulated crash")
        real_rename(fs, src, dst)

    monkeypatch.setattr(checkpoint, "_rename", rename_then_crash)
    with pytest.raises(CheckpointError, match="checkpoint-00000004.*simulated crash"):
        save_checkpoint(ckpt_dir, {"v": "new"}, TrainStatus(4))
    assert "checkpoint-00000004" not in _names(ckpt_dir)
    assert load_checkpoint(ckpt_dir) == ({"v": "old"}, TrainStatus(4))
    assert latest_train_status(ckpt_dir) == TrainStatus(4)

    monkeypatch.setattr(checkpoint, "_rename", real_rename)
    save_checkpoint(ckpt_dir, {"v": "new"}, TrainStatus(4), keep=2)
    # the set-aside copy of epoch 4 is not a version of its own: epoch 3 stays
    assert [n for n in _names(ckpt_dir) if not n.startswith(".tmp-")] == [
        "checkpoint-00000003", "checkpoint-00000004"
    ]
    assert load_checkpoint(ckpt_dir) == ({"v": "new"}, TrainStatus(4))


@pytest.mark.unit
def test_an_unloadable_newest_version_is_an_error_not_a_fallback(ckpt_dir):
    save_checkpoint(ckpt_dir, {"v": 1}, TrainStatus(1))
    version = save_checkpoint(ckpt_dir, {"v": 2}, TrainStatus(2))
    garbage = b"not a pickle"
    meta = {"format_version": 1, "epoch": 2, "time": 0, "state_bytes": len(garbage)}
    files = {"state.pkl": garbage, "meta.json": json.dumps(meta).encode()}
    _put(ckpt_dir, "checkpoint-00000002", files)
    with pytest.raises(CheckpointError, match=f"{version}/state.pkl"):
        load_checkpoint(ckpt_dir)


@pytest.mark.unit
def test_a_newer_format_version_is_refused(ckpt_dir):
    save_checkpoint(ckpt_dir, {}, TrainStatus(1))
    meta = {"format_version": 99, "epoch": 1, "time": 0, "state_bytes": 1}
    _put(ckpt_dir, "checkpoint-00000001", {"meta.json": json.dumps(meta).encode()})
    with pytest.raises(CheckpointError, match="format version 99"):
        latest_train_status(ckpt_dir)


# --- SIGKILL while saving --------------------------------------------------------------

_SAVER = textwrap.dedent(
    """
    import sys
    from trainer_agent.checkpoint import TrainStatus, save_checkpoint

    class Gate:
        # Pickled after 200 MiB of blobs: tells the test, then parks until killed.
        def __reduce__(self):
            open(sys.argv[2], "w").close()
            sys.stdin.read()
            raise SystemExit("the test should have killed this process")

    blobs = [bytes([i]) * (1 << 20) for i in range(200)]
    save_checkpoint(sys.argv[1], {"blobs": blobs, "gate": Gate()}, TrainStatus(int(sys.argv[3])))
    """
)


def _wait_for(condition, *, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"saver exited early: {proc.stderr.read().decode()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(0.01)


@pytest.mark.parametrize("epoch", [3, 4], ids=["same-epoch", "next-epoch"])
def test_sigkill_during_save_keeps_the_previous_checkpoint(tmp_path, epoch):
    ckpt = str(tmp_path / "ckpt")
    good = {"weights": list(range(1000)), "note": "good"}
    save_checkpoint(ckpt, good, TrainStatus(3))
    flag = tmp_path / "mid-write"
    pythonpath = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": pythonpath}
    proc = subprocess.Popen(
        [sys.executable, "-c", _SAVER, ckpt, str(flag), str(epoch)],
        stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )
    try:
        _wait_for(flag.exists, proc=proc)
        partial = list(Path(ckpt).glob(".tmp-*/state.pkl"))
        assert len(partial) == 1 and partial[0].stat().st_size >= 200 << 20
        assert not (partial[0].parent / "meta.json").exists()
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()
        proc.stdin.close()
        proc.stderr.close()
    assert load_checkpoint(ckpt) == (good, TrainStatus(3))
    assert latest_train_status(ckpt) == TrainStatus(3)
    assert partial[0].exists()  # the half-written temp dir is still there, and ignored
