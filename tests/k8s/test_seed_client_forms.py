"""Seed 002's `paddle job submit train <job-name>` command line, as written there (but for
its `--image:` typo and the placeholders), and its `-e=` / `--e=` spellings."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from paddlecloud.cli.jobs import job as job_cli

pytestmark = pytest.mark.unit


def _trainer_env(output: str) -> dict[str, str]:
    for doc in yaml.safe_load_all(output):
        if doc and doc.get("kind") == "Job" and doc["metadata"]["name"].endswith("-trainer"):
            container = doc["spec"]["template"]["spec"]["containers"][0]
            return {e["name"]: e.get("value") for e in container["env"]}
    raise AssertionError("no trainer Job rendered")


def test_job_submit_train_name_takes_the_seeds_command_line(tmp_path):
    package = tmp_path / "train" / "quick_start"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text("print('quick start')\n")
    result = CliRunner().invoke(job_cli, [
        "submit", "train", "quickstart",
        f"--package-path={package}",
        "--module=quick_start.train",
        "--input=/quickstart/input",
        "--output=/quickstart/output",
        "--trainers=4",
        "--pservers=2",
        "--image=registry.example/paddle_dist_example",
        "-e=NUM_PASS=5",
        "--e=LOG=1",
        "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "name: quickstart-master" in result.output
    env = _trainer_env(result.output)
    assert (env["NUM_PASS"], env["LOG"]) == ("5", "1")
    assert env["PADDLECLOUD_INPUT"] == "/quickstart/input"


def test_a_job_named_train_is_still_a_name():
    result = CliRunner().invoke(job_cli, ["submit", "train", "--module=m", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "name: train-master" in result.output


def test_bad_forms_are_one_usage_error_naming_them():
    extra = CliRunner().invoke(job_cli, ["submit", "train", "a", "b", "--module=m", "--dry-run"])
    assert extra.exit_code == 2 and "got 'train a b'" in extra.output
    bad_env = CliRunner().invoke(job_cli, ["submit", "q", "--module=m", "-e=NUM_PASS", "--dry-run"])
    assert bad_env.exit_code == 2 and "'=NUM_PASS' is not KEY=VALUE" in bad_env.output


def test_the_seeds_image_colon_is_answered_with_did_you_mean_image():
    # seed 002's `--image:<your image>`, beside its `-e=NUM_PASS=5` (which keeps working)
    result = CliRunner().invoke(job_cli, [
        "submit", "train", "quickstart", "--module=quick_start.train", "--input=/quickstart/input",
        "--image:registry.example/paddle_dist_example", "-e=NUM_PASS=5", "--dry-run"])
    assert result.exit_code == 2, result.output
    assert "No such option: --image:registry.example/paddle_dist_example" in result.output
    assert "Did you mean '--image'?" in result.output


def test_local_train_answers_the_image_colon_with_did_you_mean_image():
    from paddlecloud.cli.local import local

    result = CliRunner().invoke(local, ["train", "--module=demo.train", "--input=in",
                                        "--image:paddlepaddle/paddle", "--e=NUM_PASS=4"])
    assert result.exit_code == 2, result.output
    assert "Did you mean '--image'?" in result.output


def _package_configmap(output: str) -> dict[str, str]:
    for doc in yaml.safe_load_all(output):
        if doc and doc.get("kind") == "ConfigMap" and doc["metadata"]["name"].endswith("-package"):
            return doc["data"]
    raise AssertionError("no package ConfigMap rendered")


def demo_package(tmp_path) -> str:
    """Seed 002's `./demo` package: demo/train.py (importing its sibling as demo.dataset)."""
    package = tmp_path / "demo"
    package.mkdir()
    (package / "train.py").write_text("from demo import dataset\nprint(dataset.NAME)\n")
    (package / "dataset.py").write_text("NAME = 'demo'\n")
    return str(package)


@pytest.mark.parametrize("module, key", [("demo.train", "demo__train.py"), ("train", "train.py")],
                         ids=["folder-as-top-package", "folder-as-import-root"])
def test_job_submit_takes_the_package_folder_as_top_package_or_as_import_root(tmp_path, module, key):
    result = CliRunner().invoke(job_cli, ["submit", "demo", f"--package-path={demo_package(tmp_path)}",
                                          f"--module={module}", "--input=/demo/input", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert key in _package_configmap(result.output)  # where `python -m MODULE` finds it


def test_job_submit_refuses_a_module_the_package_does_not_hold_before_anything_is_made(tmp_path):
    result = CliRunner().invoke(job_cli, ["submit", "demo", f"--package-path={demo_package(tmp_path)}",
                                          "--module=demo.nope", "--input=/demo/input", "--dry-run"])
    assert result.exit_code == 1, result.output
    assert "module 'demo.nope' is not in --package-path" in result.output


def test_job_submit_without_a_module_runs_the_packages_trainer_py(tmp_path):
    # seed 001's example project, through the CLI door: trainer_package is the entry point
    package = tmp_path / "quick_start"
    package.mkdir()
    (package / "trainer.py").write_text("print('quick start')\n")
    result = CliRunner().invoke(job_cli, ["submit", "quickstart", f"--package-path={package}",
                                          "--input=/quickstart/input", "--dry-run"])
    assert result.exit_code == 0, result.output
    stored = next(d for d in yaml.safe_load_all(result.output)
                  if d and d["metadata"]["name"] == "quickstart-spec")
    assert "module: trainer\n" in stored["data"]["job.yaml"]
