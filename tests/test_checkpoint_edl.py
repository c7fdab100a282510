"""EDL's checkpoint calls (seed 000) as its users write them: `save_checkpoint(exe,
train_status=..., path=..., fs=...)` and `load_checkpoint(exe, path, fs=..., trainer_id=...)`,
with `fs` any fsspec filesystem, and `hdfs://` through the `hdfs` extra."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import fsspec
import numpy as np
import pytest
import tomllib
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem

import trainer_agent as fleet  # the seed calls them as fleet.save_checkpoint / fleet.load_checkpoint
from trainer_agent.checkpoint import TrainStatus

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]


def _edl_run(exe, args, fs, *, trainer_id: int, params: dict, trained: list[int]) -> None:
    """Seed 000's loop, verbatim but for `train()`, which records the pass and changes the state."""

    def train():
        trained.append(pass_id)
        exe["passes"] = exe.get("passes", 0) + 1

    train_status = TrainStatus()
    tmp_s = fleet.load_checkpoint(exe, args.checkpoint, fs=fs, trainer_id=trainer_id)
    if tmp_s is not None:
        train_status = tmp_s

    for pass_id in range(train_status.next(), params["num_epochs"]):
        train()

        if trainer_id == 0:
            saved_status = TrainStatus(pass_id)
            fleet.save_checkpoint(exe, train_status=saved_status,
                                  path=args.checkpoint, fs=fs)


def test_the_seeds_loop_resumes_at_the_next_pass_on_the_fs_it_names(tmp_path):
    # a relative path on a DirFileSystem: only the fs given makes it land in tmp_path/root
    fs = DirFileSystem(path=str(tmp_path / "root"), fs=LocalFileSystem())
    args = SimpleNamespace(checkpoint="job/ckpt")
    first: list[int] = []
    _edl_run({}, args, fs, trainer_id=0, params={"num_epochs": 2}, trained=first)
    assert first == [0, 1]
    assert (tmp_path / "root/job/ckpt/checkpoint-00000001/meta.json").is_file()

    exe: dict = {}
    again: list[int] = []
    _edl_run(exe, args, fs, trainer_id=1, params={"num_epochs": 4}, trained=again)
    assert again == [2, 3]  # resumed after the saved pass
    assert exe == {"passes": 4}  # trainer 1 loaded the state (2 passes), trained 2 more
    assert fleet.latest_train_status(str(tmp_path / "root/job/ckpt")) == TrainStatus(1)  # saved none


def test_a_paddle_layer_is_saved_and_loaded_through_its_state_dict():
    import paddle

    fs = fsspec.filesystem("memory")
    layer = paddle.nn.Linear(3, 2)
    fleet.save_checkpoint(layer, train_status=TrainStatus(0), path="/edl-layer/ckpt", fs=fs)
    other = paddle.nn.Linear(3, 2)
    assert fleet.load_checkpoint(other, "/edl-layer/ckpt", fs=fs, trainer_id=0) == TrainStatus(0)
    np.testing.assert_array_equal(other.weight.numpy(), layer.weight.numpy())
    fs.rm("/edl-layer", recursive=True)


def test_the_plain_form_still_returns_state_and_status(tmp_path):
    fleet.save_checkpoint(str(tmp_path), {"w": 1}, TrainStatus(3))
    assert fleet.load_checkpoint(str(tmp_path)) == ({"w": 1}, TrainStatus(3))


@pytest.mark.parametrize("call, message", [
    (lambda: fleet.save_checkpoint({}, train_status=TrainStatus(0), path="x", fs=object()),
     "fs must be an fsspec filesystem"),
    (lambda: fleet.save_checkpoint({}, "x", path="y", train_status=TrainStatus(0)),
     "two values for 'path'"),
    (lambda: fleet.save_checkpoint({}, train_status=TrainStatus(0)), "needs path="),
    (lambda: fleet.load_checkpoint({}, path="x", trainer_id=-1), "trainer_id -1"),
    (lambda: fleet.load_checkpoint(object(), "x"), None),
])
def test_bad_arguments_are_one_clear_error(tmp_path, monkeypatch, call, message):
    monkeypatch.chdir(tmp_path)
    if message is None:  # nothing saved yet: None, whatever the target
        assert call() is None
        return
    with pytest.raises((TypeError, ValueError), match=message):
        call()


def test_a_target_that_cannot_take_a_state_is_named(tmp_path):
    fleet.save_checkpoint({"w": 1}, train_status=TrainStatus(0), path=str(tmp_path))
    with pytest.raises(TypeError, match="into a object"):
        fleet.load_checkpoint(object(), str(tmp_path))


def test_hdfs_urls_load_pyarrows_filesystem_through_the_hdfs_extra():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(req.startswith("pyarrow") for req in extras["hdfs"])
    from fsspec.implementations.arrow import HadoopFileSystem

    assert fsspec.get_filesystem_class("hdfs") is HadoopFileSystem  # the import path works


def test_without_pyarrow_an_hdfs_checkpoint_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if not installed
    monkeypatch.delitem(sys.modules, "fsspec.implementations.arrow", raising=False)
    monkeypatch.delitem(sys.modules["fsspec.registry"]._registry, "hdfs", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'paddlecloud\[hdfs\]'"):
        fleet.load_checkpoint({}, "hdfs://namenode:8020/ckpt", trainer_id=0)
