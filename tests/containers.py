"""A real container engine for the tests: podman (or docker), and the images they run.

No image can be pulled here, so every image is built on this machine:

- the **base** (`localhost/paddlecloud-test-base`): a Debian bookworm root filesystem with
  python3 and pip, made by `mmdebstrap` from Debian's packages and imported once per machine;
- **paddlecloud's image** (`localhost/paddlecloud:test-<digest of the source>`): the base
  with this tree's wheel and its dependencies' wheels installed, built again only when the
  source changes (what `deploy/Dockerfile` builds, from a base that needs no registry);
  `paddlecloud_image(with_paddle=True)` builds the same on a base that also holds the
  PaddlePaddle (CPU) of the tests' own environment, for pods that train for real;
  `paddle2_base_image()` the base with Paddle 2.6.2 (the last with a parameter-server core),
  for users' images of Paddle 2.x;
- **users' images**: `build_image` with a Containerfile and files, shaped as a test wants
  (built as root, files in `WORKDIR`, an `ENTRYPOINT`, no paddlecloud inside).

Images are built under a file lock, so two pytest workers never build the same one twice.
Where no engine (or no mmdebstrap) is installed the caller is skipped, except under CI
(`CI=true`), where `.ci/run` installs them and a missing one FAILS.

The engine runs as root with `--runtime runc` and cgroupfs (crun fails on this machine's hybrid
cgroups): `.ci/run` writes `/etc/containers/containers.conf` for that.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from tests.real_parts import file_lock, require

ROOT = Path(__file__).resolve().parent.parent
BASE_IMAGE = "localhost/paddlecloud-test-base:bookworm-1"
PADDLECLOUD_IMAGE = "localhost/paddlecloud"
PADDLE_BASE_IMAGE = "localhost/paddlecloud-test-paddle-base"
SOURCE_DIRS = ("paddlecloud", "master", "trainer_agent", "pserver_agent", "autoscaler",
               "pdj_operator", "job_server", "examples")
LOCK = Path(tempfile.gettempdir()) / "paddlecloud-test-images.lock"
BUILD_TIMEOUT = 900


def engine() -> str:
    """The container engine's executable: podman first, else docker; "" when neither."""
    for name in ("podman", "docker"):
        found = shutil.which(name)
        if found:
            return found
    return ""


def missing() -> str:
    """Why no container can run here; "" when one can."""
    if not engine():
        return "no container engine (apt-get install podman runc)"
    if not shutil.which("mmdebstrap") and not image_exists(BASE_IMAGE):
        return "mmdebstrap is missing to build the base image (apt-get install mmdebstrap)"
    return ""


def require_engine() -> None:
    """Skips the test without an engine; fails it under CI, which must have one."""
    require(missing(), needs="a container engine for the container tests")


def run_engine(*args: str, timeout: float = BUILD_TIMEOUT, check: bool = True,
               stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    """One engine command; its output is in the error when it fails."""
    result = subprocess.run([engine(), *args], capture_output=True, timeout=timeout,
                            input=stdin.decode() if stdin is not None else None, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"{Path(engine()).name} {' '.join(args[:3])} ... exited "
                             f"{result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def image_exists(tag: str) -> bool:
    if not engine():
        return False
    return run_engine("image", "exists", tag, check=False, timeout=60).returncode == 0


def _building() -> contextlib.AbstractContextManager[None]:
    return file_lock(LOCK)


def base_image() -> str:
    """The Debian base (python3, pip), made with mmdebstrap once per machine."""
    require_engine()
    with _building():
        if not image_exists(BASE_IMAGE):
            with tempfile.TemporaryDirectory(prefix="paddlecloud-rootfs-") as scratch:
                rootfs = Path(scratch) / "rootfs.tar"
                subprocess.run(["mmdebstrap", "--quiet", "--variant=apt",
                                "--include=python3,python3-pip", "bookworm", str(rootfs)],
                               check=True, capture_output=True, timeout=BUILD_TIMEOUT)
                run_engine("import", "--quiet", str(rootfs), BASE_IMAGE)
    return BASE_IMAGE


def build_image(tag: str, *, containerfile: str, files: Mapping[str, bytes | str] = {}) -> str:
    """Builds `tag` from a Containerfile (its `FROM` may name `base_image()`) and a context
    holding `files` (relative path -> content); returns the tag."""
    require_engine()
    with tempfile.TemporaryDirectory(prefix="paddlecloud-context-") as context:
        for name, content in files.items():
            path = Path(context) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, str):
                path.write_text(content)
            else:
                path.write_bytes(content)
        _build(Path(context), tag, containerfile)
    return tag


def _build(context: Path, tag: str, containerfile: str) -> None:
    """`tag` from `containerfile` and the files already in `context`, with no network."""
    (context / "Containerfile").write_text(containerfile)
    run_engine("build", "--quiet", "--network", "none", "-t", tag, "-f",
               str(context / "Containerfile"), str(context))


def source_digest() -> str:
    """A digest of what goes into paddlecloud's image: the packages' files and pyproject."""
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes())
    for folder in SOURCE_DIRS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(ROOT)).encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


_PADDLECLOUD_CONTAINERFILE = f"""\
FROM {BASE_IMAGE}
COPY wheels /tmp/wheels
RUN python3 -m pip install --quiet --no-index --no-cache-dir --break-system-packages \\
        --find-links /tmp/wheels paddlecloud && rm -rf /tmp/wheels
COPY examples /opt/paddlecloud/examples
RUN groupadd --gid 10001 paddle && useradd --uid 10001 --gid 10001 --create-home paddle
ENV PYTHONUNBUFFERED=1 PYTHONPATH=/opt/paddlecloud HOME=/home/paddle
USER 10001:10001
CMD ["paddlecloud", "--help"]
"""


WHEELS_KEPT = 3600  # seconds a folder of another source digest's wheels is kept


def wheels() -> Path:
    """This tree's wheel and its dependencies' wheels, in a folder kept per source digest (the
    image of this tree, and images that install part of it, are built from the same)."""
    folder = Path(tempfile.gettempdir()) / f"paddlecloud-test-wheels-{source_digest()}"
    with _building():
        if not folder.is_dir():
            for old in folder.parent.glob("paddlecloud-test-wheels-*"):
                if time.time() - old.stat().st_mtime > WHEELS_KEPT:
                    shutil.rmtree(old, ignore_errors=True)
            partial = Path(tempfile.mkdtemp(prefix="paddlecloud-wheels-"))
            # The dependencies' wheels come from pip's cache or the package index, on this
            # machine; the image builds themselves have no network.
            subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "-w", str(partial),
                            str(ROOT)], check=True, capture_output=True, timeout=BUILD_TIMEOUT)
            partial.rename(folder)
    return folder


# The last PaddlePaddle with a parameter-server core (3.1.1 and later have none,
# ../shared/paddle-ps/README.md) and the pins it needs: protobuf 7 breaks its
# DistributedStrategy, numpy 2 its C extension.
PADDLE_2_VERSION = "2.6.2"
PADDLE_PINS = {PADDLE_2_VERSION: ("numpy<2", "protobuf>=4.21,<5")}


def paddle_base_image(version: str | None = None) -> str:
    """The base with a PaddlePaddle (CPU): `version`, or the one the tests' own environment
    runs (its wheels and their dependencies, with the pins that version needs, and the OpenMP
    runtime its core links), once per machine and version: the wheels come from pip's cache or
    the package index and libgomp1 from Debian's (`apt-get download`), on this machine; the
    build itself has no network."""
    from importlib.metadata import version as installed

    base_image()
    wanted = version or installed("paddlepaddle")
    requirements = [f"paddlepaddle=={wanted}", *PADDLE_PINS.get(wanted, ())]
    tag = f"{PADDLE_BASE_IMAGE}:{wanted}"
    with _building():
        if image_exists(tag):
            return tag
        with tempfile.TemporaryDirectory(prefix="paddlecloud-paddle-") as context:
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "-d",
                            str(Path(context) / "wheels"), *requirements],
                           check=True, capture_output=True, timeout=BUILD_TIMEOUT)
            (Path(context) / "debs").mkdir()
            subprocess.run(["apt-get", "download", "libgomp1"], cwd=Path(context) / "debs",
                           check=True, capture_output=True, timeout=BUILD_TIMEOUT)
            quoted = " ".join(f"'{r}'" for r in requirements)
            _build(Path(context), tag,
                   f"FROM {BASE_IMAGE}\nCOPY wheels /tmp/wheels\nCOPY debs /tmp/debs\n"
                   "RUN dpkg -i /tmp/debs/*.deb && python3 -m pip install --quiet --no-index "
                   f"--no-cache-dir --break-system-packages --find-links /tmp/wheels {quoted} "
                   "&& rm -rf /tmp/wheels /tmp/debs\n")
    return tag


def paddle2_base_image() -> str:
    """The base with Paddle 2.6.2 (CPU, parameter-server core included), pinned as it needs."""
    return paddle_base_image(PADDLE_2_VERSION)


def paddlecloud_image(*, with_paddle: bool = False) -> str:
    """paddlecloud's own image, built from this tree, again only when the source changed; no
    PaddlePaddle (the seeds' users bring theirs in their own images) unless `with_paddle`."""
    base = paddle_base_image() if with_paddle else base_image()
    tag = f"{PADDLECLOUD_IMAGE}:test-{source_digest()}{'-paddle' if with_paddle else ''}"
    if image_exists(tag):
        return tag
    built = wheels()
    with _building():
        if image_exists(tag):
            return tag
        with tempfile.TemporaryDirectory(prefix="paddlecloud-image-") as context:
            shutil.copytree(built, Path(context) / "wheels")
            shutil.copytree(ROOT / "examples", Path(context) / "examples",
                            ignore=shutil.ignore_patterns("__pycache__"))
            _build(Path(context), tag,
                   _PADDLECLOUD_CONTAINERFILE.replace(f"FROM {BASE_IMAGE}", f"FROM {base}", 1))
    return tag


if __name__ == "__main__":
    # `make test` builds the test images before pytest starts: built inside the suite, the
    # Paddle image (1.3 GB) took a core from the timing-bound tests running beside it (so does
    # the Paddle 2.6.2 base, 1 GB, for users' images of Paddle 2.x). A
    # machine that cannot build them goes on: the container tests skip (or, under CI, fail)
    # on their own.
    if missing():
        print(f"test images not built: {missing()}")
    else:
        try:
            for tag in (paddlecloud_image(), paddlecloud_image(with_paddle=True), paddle2_base_image()):
                print(f"test image {tag}")
        except Exception as error:  # whatever it is, the container tests meet it and say so
            print(f"test images not built ({error}): the container tests build them")
