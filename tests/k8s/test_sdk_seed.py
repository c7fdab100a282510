"""The Python API as seed 001 writes it: its `PaddleJob(...)` example, its parameter table
(`job_name`, `trainer_package` the entry point, `input`/`output` a string or a list,
`volume` a claim mounted where the paths point), and `dist_train(trainer=None, reader=None,
num_passes=1, event_handler=None, feeding=None, paddle_job=None)` with PADDLE_NOTEBOOK."""

from __future__ import annotations

import asyncio
import io
import logging
import zipfile

import pytest
from click.testing import CliRunner
from test_sdk import job_server  # noqa: F401  (a real Job Server on kmock)

from paddlecloud import PaddleJob, dist_train
from paddlecloud.backends.k8s import manifests
from paddlecloud.cli.jobs import job as job_cli
from paddlecloud.jobspec import DataVolume, JobSpec, JobSpecError
from paddlecloud.sdk import EndIteration, EndPass, JobHandle


def seed_job(**changes) -> PaddleJob:
    """Seed 001's example, verbatim (its unquoted paths quoted), with `changes` made to it."""
    if not changes:
        return PaddleJob(
          job_name="quickstart",
          pservers=4,
          volume="quickstart",
          input="/quickstart/input",
          output="/quickstart/output",
          base_image="paddlepaddle/paddle:0.10.rc2",
          use_gpu=False,
          memory="512M")
    fields = {"job_name": "quickstart", "pservers": 4, "volume": "quickstart",
              "input": "/quickstart/input", "output": "/quickstart/output",
              "base_image": "paddlepaddle/paddle:0.10.rc2", "use_gpu": False, "memory": "512M"}
    return PaddleJob(**{**fields, **changes})


def quick_start(tmp_path, requirements: str = "", *, spelled: str = "requirements.txt") -> str:
    """Seed 001's example project: quick_start/{trainer.py, dataset.py, requirements.txt}
    (`spelled="requirments.txt"`: as the seed spells it)."""
    package = tmp_path / "paddle_example" / "quick_start"
    package.mkdir(parents=True)
    (package / "trainer.py").write_text("print('quick start')\n")
    (package / "dataset.py").write_text("")
    (package / spelled).write_text(requirements)
    return str(package)


@pytest.mark.unit
def test_the_seeds_example_is_a_valid_job_whose_claim_holds_its_paths():
    job = seed_job()
    assert (job.input, job.output) == (("/quickstart/input",), "/quickstart/output")
    spec = job._as_request().to_spec() if job.module else None
    assert spec is None  # no entry point yet: dist_train's trainer or trainer_package gives it
    with pytest.raises(JobSpecError, match="'quickstart' has no entry point: give trainer_package"):
        job.submit(kubeconfig="/nonexistent")


@pytest.mark.unit
def test_trainer_package_is_the_entry_point_and_the_volume_is_mounted_where_the_paths_point(tmp_path):
    job = seed_job(trainer_package=quick_start(tmp_path))
    assert job.module == "trainer"
    spec = job._as_request().to_spec()
    assert spec.data_volume == DataVolume(claim="quickstart", mount_path="/quickstart")
    assert (spec.trainer_memory, spec.pserver_memory, spec.trainer_gpu) == ("512M", "512M", 0)
    pod = manifests.trainer_job(spec, None)["spec"]["template"]["spec"]
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "quickstart"}} in pod["volumes"]
    mounts = [m for c in pod["containers"] for m in c.get("volumeMounts", [])]
    assert {"name": "data", "mountPath": "/quickstart"} in mounts
    script = seed_job(trainer_package=f"{quick_start(tmp_path / 'b')}/trainer.py")
    assert (script.module, script.trainer_package) == ("trainer", str(tmp_path / "b/paddle_example/quick_start"))
    assert seed_job(input=["/quickstart/a", "/quickstart/b"]).input == ("/quickstart/a", "/quickstart/b")


@pytest.mark.parametrize("change, message", [
    ({"volume": "Quick_Start"}, "invalid claim name 'Quick_Start'"),
    ({"input": 7}, "invalid input 7"),
    ({"output": ["/a", "/b"]}, "one output directory"),
    ({"memory": "lots"}, "'lots'"),
    ({"trainer_package": "/nonexistent/train.py"}, "no such script"),
])
@pytest.mark.unit
def test_a_bad_parameter_is_one_error_naming_it(change, message):
    with pytest.raises(JobSpecError, match=message):
        seed_job(**change)


async def test_the_seeds_requirements_without_an_image_build_are_refused_before_anything_is_made(
        k8s, kubeconfig, tmp_path):
    job = seed_job(trainer_package=quick_start(tmp_path, "pillow\nprotobuf==3.1.0\n"))
    with pytest.raises(JobSpecError, match=r"lists pillow, protobuf==3\.1\.0"):
        await asyncio.to_thread(job.submit, kubeconfig=kubeconfig)
    assert k8s.posted() == []


SEED_REQUIREMENTS = "pillow\nprotobuf==3.1.0\n"  # seed 001's example, in its requirments.txt


def test_the_seeds_requirments_txt_reaches_the_upload_as_requirements_txt(tmp_path, caplog):
    job = seed_job(trainer_package=quick_start(tmp_path, SEED_REQUIREMENTS, spelled="requirments.txt"))
    with caplog.at_level(logging.WARNING):
        archive = zipfile.ZipFile(io.BytesIO(job.package_archive()))
    assert archive.read("requirements.txt").decode() == SEED_REQUIREMENTS  # not an empty one
    assert archive.read("requirments.txt").decode() == SEED_REQUIREMENTS  # the user's, kept
    assert "requirments.txt (seed 001's spelling) is read as requirements.txt" in caplog.text


async def test_the_seeds_requirments_txt_without_an_image_build_is_refused_naming_them(
        k8s, kubeconfig, tmp_path):
    package = quick_start(tmp_path, SEED_REQUIREMENTS, spelled="requirments.txt")
    job = seed_job(trainer_package=package)
    with pytest.raises(JobSpecError, match=r"lists pillow, protobuf==3\.1\.0"):
        await asyncio.to_thread(job.submit, kubeconfig=kubeconfig)
    cli = CliRunner().invoke(job_cli, ["submit", "quickstart", f"--package-path={package}",
                                       "--module=trainer", "--dry-run"])
    assert cli.exit_code == 1 and "lists pillow, protobuf==3.1.0" in cli.output, cli.output
    assert "warning: package" in cli.output and "is read as requirements.txt" in cli.output
    assert k8s.posted() == []


async def test_dist_train_in_a_notebook_submits_the_seeds_job_through_the_server(
        k8s, job_server, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("PADDLE_NOTEBOOK", "YES")
    job = seed_job(trainer_package=quick_start(tmp_path))
    handle = await asyncio.to_thread(dist_train, trainer=object(), reader=None, paddle_job=job,
                                     server=job_server, token="tok")
    assert isinstance(handle, JobHandle) and handle.name == "quickstart"
    stored = JobSpec.from_yaml(k8s.stored("configmaps", "team-a", "quickstart-spec")["data"][manifests.SPEC_KEY])
    assert stored.data_volume == DataVolume(claim="quickstart", mount_path="/quickstart")
    assert stored.module == "trainer" and stored.inputs == ("/quickstart/input",)


class V2Trainer:
    """Paddle v2's `paddle.trainer.SGD` shape: `train(reader, num_passes, event_handler, feeding)`."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def train(self, reader, num_passes, event_handler, feeding):
        self.calls.append((reader, num_passes, event_handler, feeding))
        return "trained"


@pytest.mark.unit
def test_dist_train_without_a_notebook_calls_the_trainer_as_the_seeds_pseudo_code(monkeypatch):
    monkeypatch.delenv("PADDLE_NOTEBOOK", raising=False)
    trainer, reader, handler = V2Trainer(), object(), print
    assert dist_train(trainer=trainer, reader=reader, num_passes=3, event_handler=handler,
                      feeding={"x": 0}, paddle_job=seed_job()) == "trained"
    assert trainer.calls == [(reader, 3, handler, {"x": 0})]


@pytest.mark.unit
def test_dist_train_fits_a_paddle_model_with_v2_events(monkeypatch):
    import numpy as np
    import paddle

    monkeypatch.delenv("PADDLE_NOTEBOOK", raising=False)

    class Pairs(paddle.io.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            x = np.full([2], i, dtype="float32")
            return x, x.sum(keepdims=True)

    net = paddle.nn.Linear(2, 1)
    model = paddle.Model(net, inputs=[paddle.static.InputSpec([None, 2], "float32", "x")],
                         labels=[paddle.static.InputSpec([None, 1], "float32", "y")])
    model.prepare(paddle.optimizer.SGD(learning_rate=0.01, parameters=net.parameters()),
                  paddle.nn.MSELoss())
    events: list = []
    dist_train(trainer=model, reader=paddle.io.DataLoader(Pairs(), batch_size=4), num_passes=2,
               event_handler=events.append)
    assert [(type(e), e.pass_id) for e in events if isinstance(e, EndPass)] == [(EndPass, 0), (EndPass, 1)]
    assert [(e.pass_id, e.batch_id) for e in events if isinstance(e, EndIteration)] == [
        (0, 0), (0, 1), (1, 0), (1, 1)]
    assert "loss" in events[0].metrics
    with pytest.raises(ValueError, match="drop feeding"):
        dist_train(trainer=model, reader=None, feeding={"x": 0})


def test_the_package_folder_may_be_the_modules_top_package(tmp_path):
    # seed 002's form at the Python API: trainer_package ./demo, module demo.train
    package = tmp_path / "demo"
    package.mkdir()
    (package / "train.py").write_text("print('demo')\n")
    job = seed_job(trainer_package=str(package), module="demo.train")
    archive = zipfile.ZipFile(io.BytesIO(job.package_archive()))
    assert "demo/train.py" in archive.namelist()  # importable as demo.train where it lands
    with pytest.raises(JobSpecError, match=r"module 'demo\.nope' is not in trainer_package"):
        seed_job(trainer_package=str(package), module="demo.nope").submit(kubeconfig="/nonexistent")
