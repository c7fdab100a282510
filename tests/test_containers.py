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
