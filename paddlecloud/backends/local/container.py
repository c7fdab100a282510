"""`paddlecloud local train --image IMG`: each trainer and pserver in a container of the user's image.

The PaddlePaddle client's `paddle local train --image` (seed 002) ran the user's image with
`-v INPUT:/train/input -v OUTPUT:/train/output -v PACKAGE:/train/package -e K=V`. This keeps
that contract without assuming anything of the image but the user's program (paddlecloud is
not in it): our launchers (`paddlecloud trainer`, the pserver agent) stay on the host, and
their child is this module's small wrapper, which runs one container through docker or
podman. The launchers' PaddlePaddle environment (docs/design.md section 8: TRAINING_ROLE, ids,
endpoints, the master's location through etcd) reaches the container as `-e NAME` (values
come from the engine client's environment, never from its command line: the job token file
is among them), and values that name a mounted host path are rewritten to the path the
container sees (`OUTPUT/x` becomes `/train/output/x`). The job's state folder
`OUTPUT/.paddlecloud` is hidden from the container (`job_mounts`): only the trainer token
(and CA) cross, read-only, at /var/run/paddlecloud.

The container runs on the host's network (`--network host`), so the 127.0.0.1 endpoints of
the job's etcd and master stay valid inside it. That needs an engine that can share the host
network: root podman and docker do; rootless podman does too with its default
slirp4netns/pasta networking replaced by `--network host` (allowed rootless); docker
Desktop (a VM) does not reach the host's 127.0.0.1 this way.

The command is the image's own ENTRYPOINT/CMD (arguments after `--` become its CMD), or
with `--module M` `python3 -m M` (else `python -m M`) run through the image's `sh`, with
/train/package first on PYTHONPATH: a user's image is never wrapped in paddlecloud.

Stopping: SIGTERM or SIGINT to the wrapper runs `ENGINE stop -t STOP_GRACE NAME` (the image's
stop signal, then SIGKILL, as a kubelet does) and the container is removed; a wrapper killed
before it could is covered by `remove_containers`, which the job runs at its end on every
container carrying its run's label. Containers are named `paddlecloud-JOB-ROLE-ID` so a person
can find them (`podman ps --filter label=paddlecloud.job=JOB`).

What this does NOT do: pull an image (the image must exist locally: `check_image` says so
before anything starts, and every run says `--pull never`), map the user's uid (the container
runs as its image says; files it writes into --output belong to that user), or limit CPU and
memory.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from paddlecloud.backends.local.handle import SECRETS_DIR

ENGINES = ("podman", "docker")
INPUT_DIR, OUTPUT_DIR, PACKAGE_DIR = "/train/input", "/train/output", "/train/package"
IMPORT_DIR = "/train/import"  # where a package folder that is its module's top package is importable
CREDENTIALS_DIR = "/var/run/paddlecloud"  # the trainer token (and CA), where Kubernetes pods find theirs
STOP_GRACE = 3          # seconds `ENGINE stop` gives the program after its stop signal
ENGINE_TIMEOUT = 60     # seconds for one engine command that starts no container
JOB_LABEL, RUN_LABEL = "paddlecloud.job", "paddlecloud.run"
# What the launchers and the job give a program (docs/design.md section 8), plus the user's -e
# names: everything else of the host's environment (PATH, HOME, PYTHONPATH) stays the image's.
FORWARDED_PREFIXES = ("PADDLE", "TRAINING_ROLE", "POD_IP", "GLOG_", "FLAGS_", "PYTHONUNBUFFERED",
                      "PYTHONWARNINGS", "TRAINER_PORTS_NUM", "DISTRIBUTED_TRAINER_ENDPOINTS")
# Top directories an input is never mounted over at its own path (the image's system is there).
SYSTEM_DIRS = frozenset({"bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "run",
                         "sbin", "sys", "usr", "var"})
# The member's id, as the launchers set it: the container's name ends with it.
ID_VARIABLES = {"trainer": "PADDLE_TRAINER_ID", "pserver": "PADDLE_PSERVER_ID"}
# The image's python3 (or python), the package first on PYTHONPATH, in the image's sh; then
# `-m MODULE ARGS` runs the program, and _FIND_MODULE exits 3 when MODULE cannot be found.
_PYTHON = ('PY=$(command -v python3 || command -v python) || '
           '{ echo "paddlecloud: neither python3 nor python is on the image\'s PATH" >&2; exit 127; }; '
           f'if [ -d {PACKAGE_DIR} ]; then export PYTHONPATH={PACKAGE_DIR}${{PYTHONPATH:+:$PYTHONPATH}}; fi; '
           f'if [ -d {IMPORT_DIR} ]; then export PYTHONPATH={IMPORT_DIR}:$PYTHONPATH; fi; ')
_RUN_MODULE = _PYTHON + 'exec "$PY" -m "$@"'
_FIND_MODULE = _PYTHON + ('exec "$PY" -c "import importlib.util, sys\n'
                          'try:\n    found = importlib.util.find_spec(sys.argv[1])\n'
                          'except ImportError:\n    found = None\n'
                          'sys.exit(0 if found else 3)" "$1"')


class EngineError(ValueError):
    """No engine, or no such image: the message names what is missing."""


@dataclass(frozen=True)
class Mount:
    host: str
    target: str
    read_only: bool = True
    tmpfs: bool = False  # an empty in-memory folder at `target` (no host path): hides what is below

    def flag(self) -> str:
        return f"{self.host}:{self.target}" + (":ro" if self.read_only else "")

    def argv(self, *, podman: bool) -> list[str]:
        if self.tmpfs:
            # podman fills a tmpfs with what lies below it unless told not to (docker never does)
            return ["--tmpfs", f"{self.target}:rw,mode=0700,size=64k" + (",notmpcopyup" if podman else "")]
        return ["-v", self.flag()]


@dataclass(frozen=True)
class ContainerSpec:
    """One role's containers: what the wrapper needs to run a member of it."""

    engine: str                       # the engine's executable
    image: str
    job: str
    run: str                          # this run's label value: `remove_containers` finds them by it
    role: str = "trainer"             # "trainer" or "pserver"
    mounts: tuple[Mount, ...] = ()
    env_names: tuple[str, ...] = ()   # the user's -e names, forwarded beside FORWARDED_PREFIXES
    module: str | None = None         # None: the image's own entrypoint
    args: tuple[str, ...] = ()

    def for_role(self, role: str, *, module: str | None, args: Sequence[str]) -> ContainerSpec:
        return dataclasses.replace(self, role=role, module=module, args=tuple(args))

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ContainerSpec:
        fields = json.loads(text)
        fields["mounts"] = tuple(Mount(**m) for m in fields["mounts"])
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})

    def wrapper_command(self) -> list[str]:
        """What a launcher runs as its child: this module, on the host, with this spec."""
        return [sys.executable, "-m", "paddlecloud.backends.local.container", self.to_json()]

    def name(self, environ: Mapping[str, str]) -> str:
        member = environ.get(ID_VARIABLES.get(self.role, ""), "0")
        return container_name(f"paddlecloud-{self.job}-{self.role}-{member}")

    def environment(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The container's environment: the forwarded names, mounted host paths rewritten."""
        names = set(self.env_names)
        pairs = sorted(((m.host, m.target) for m in self.mounts if not m.tmpfs), key=lambda p: -len(p[0]))
        return {name: _rewrite(value, pairs) for name, value in environ.items()
                if name in names or name.startswith(FORWARDED_PREFIXES)}

    def run_argv(self, name: str, env_names: Sequence[str]) -> list[str]:
        argv = [self.engine, "run", "--rm", "--pull", "never", "--name", name, "--network", "host",
                "--label", f"{JOB_LABEL}={self.job}", "--label", f"{RUN_LABEL}={self.run}"]
        for mount in self.mounts:
            argv += mount.argv(podman=Path(self.engine).name.startswith("podman"))
        for env_name in sorted(env_names):
            argv += ["-e", env_name]
        if self.module is None:
            return [*argv, self.image, *self.args]
        return [*argv, "--entrypoint", "sh", self.image, "-c", _RUN_MODULE, "sh", self.module, *self.args]


def _rewrite(value: str, pairs: Sequence[tuple[str, str]]) -> str:
    for host, target in pairs:
        value = re.sub(re.escape(host.rstrip("/")) + r"(?=/|,|:|$)", target, value)
    return value


def container_name(text: str) -> str:
    """A name the engines accept ([a-zA-Z0-9][a-zA-Z0-9_.-]*) from a job's name."""
    return re.sub(r"[^a-zA-Z0-9_.-]+", "-", text)


def find_engine(name: str | None) -> str:
    """The engine's executable: `name`, or the first of podman and docker on PATH."""
    for candidate in (name,) if name else ENGINES:
        found = shutil.which(candidate)
        if found:
            return found
    if name:
        raise EngineError(f"--engine {name}: {name!r} is not on PATH")
    raise EngineError("no container engine: --image runs trainers and pservers in containers through "
                      "podman or docker, and neither is on PATH")


def check_image(engine: str, image: str) -> None:
    """Refuses an image the engine does not hold locally (nothing is pulled)."""
    try:
        found = subprocess.run([engine, "image", "inspect", image], capture_output=True, text=True,
                               timeout=ENGINE_TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise EngineError(f"{Path(engine).name} did not answer within {ENGINE_TIMEOUT} s "
                          f"about image {image[:200]!r}") from None
    if found.returncode != 0:
        # the engine's own words: "image not known", or that it cannot run at all (no daemon)
        said = (found.stderr.strip().splitlines() or ["no answer"])[-1][:200]
        raise EngineError(f"image {image[:200]!r} is not among {Path(engine).name}'s local images "
                          f"(nothing is pulled: build or pull it first); {Path(engine).name} said: {said}")


def check_module(spec: ContainerSpec, module: str) -> None:
    """Refuses (`EngineError`) a module a container of the job's image, with the job's mounts
    and PYTHONPATH, cannot find: before anything starts, rather than after the group's restarts."""
    argv = [spec.engine, "run", "--rm", "--pull", "never", "--network", "none",
            *(a for m in spec.mounts for a in ("-v", m.flag())),
            "--entrypoint", "sh", spec.image, "-c", _FIND_MODULE, "sh", module]
    try:
        found = subprocess.run(argv, capture_output=True, text=True, timeout=ENGINE_TIMEOUT,
                               stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise EngineError(f"{Path(spec.engine).name} did not answer within {ENGINE_TIMEOUT} s "
                          f"looking for module {module!r} in image {spec.image[:200]!r}") from None
    if found.returncode == 3:
        raise EngineError(f"module {module!r} is not found in image {spec.image[:200]!r} (nor in "
                          f"--package-path, mounted at {PACKAGE_DIR} on its PYTHONPATH): give the "
                          "module the image or the package holds")
    if found.returncode != 0:
        said = (found.stderr.strip().splitlines() or ["no answer"])[-1][:200]
        raise EngineError(f"could not look for module {module!r} in image {spec.image[:200]!r}: "
                          f"{Path(spec.engine).name} said: {said}")


def run_python_in_image(engine: str, image: str, script: str, *, timeout: float = 120) -> str:
    """What `script` prints when run by the image's python3 (else python), with no network:
    how `local train --pservers` probes an image's PaddlePaddle (paddlecloud.paddle_probe)."""
    runner = 'command -v python3 >/dev/null && exec python3 -c "$0"; exec python -c "$0"'
    try:
        found = subprocess.run([engine, "run", "--rm", "--pull", "never", "--network", "none",
                                "--entrypoint", "sh", image, "-c", runner, script],
                               capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise EngineError(f"probing image {image[:200]!r} took more than {timeout:g} s") from None
    return found.stdout + found.stderr[-300:]


def job_mounts(*, inputs: Sequence[str], output: Path, package_path: Path | None,
               top_package: bool = False, tls: bool = False) -> tuple[Mount, ...]:
    """Seed 002's mounts: the inputs (read-only) at /train/input, or /train/input/N for
    several roots, and at their own host paths too (the master's tasks name those), unless
    that would hide the image's system directories; --output
    (writable) at /train/output; --package-path (read-only) at /train/package, and, where
    it is the module's top package, at /train/import/ITS-NAME too (on PYTHONPATH first).

    The job's state folder OUTPUT/.paddlecloud (every token, the operator's among them, the
    CA, job.json) is hidden under an empty tmpfs: the program (root in many images) can
    neither read the operator token nor rewrite the job's state. It gets what a trainer
    needs and no more, read-only at the Kubernetes pods' paths: the trainer token (and with
    `tls` the CA certificate), PADDLE_JOB_TOKEN_FILE and PADDLE_MASTER_CA_FILE rewritten there."""
    roots = list(dict.fromkeys(_input_root(p) for p in inputs if "://" not in p))
    mounts = [Mount(root, INPUT_DIR if len(roots) == 1 else f"{INPUT_DIR}/{i}") for i, root in enumerate(roots)]
    mounts += [Mount(root, root) for root in roots if _mountable_as_is(root)]
    mounts.append(Mount(str(output), OUTPUT_DIR, read_only=False))
    secrets = output / SECRETS_DIR
    mounts.append(Mount("", f"{OUTPUT_DIR}/{SECRETS_DIR}", tmpfs=True))
    mounts.append(Mount(str(secrets / "tokens" / "trainer"), f"{CREDENTIALS_DIR}/tokens/trainer"))
    if tls:
        mounts.append(Mount(str(secrets / "ca.crt"), f"{CREDENTIALS_DIR}/ca.crt"))
    if package_path is not None:
        mounts += package_mounts(package_path, top_package=top_package)
    return tuple(mounts)


def package_mounts(package_path: Path, *, top_package: bool) -> tuple[Mount, ...]:
    """--package-path (read-only) at /train/package, and at /train/import/ITS-NAME where it is
    the module's top package."""
    mounts = [Mount(str(package_path), PACKAGE_DIR)]
    if top_package:
        mounts.append(Mount(str(package_path), f"{IMPORT_DIR}/{package_path.name}"))
    return tuple(mounts)


def _mountable_as_is(root: str) -> bool:
    """Whether a host directory may be mounted at its own path: not where it would hide the
    image's system (/, /usr/..., /etc/...)."""
    parts = Path(root).parts
    return len(parts) > 1 and parts[1] not in SYSTEM_DIRS


def _input_root(path: str) -> str:
    """The directory an input names: itself, or the directory of a file or glob."""
    parts = Path(path).parts
    plain = next((i for i, part in enumerate(parts) if re.search(r"[*?\[]", part)), len(parts))
    root = Path(*parts[:plain])
    return str(root if plain < len(parts) or root.is_dir() else root.parent)


def remove_containers(engine: str, run: str) -> list[str]:
    """Removes (killing) every container of this run; returns the names it found."""
    listed = subprocess.run([engine, "ps", "--all", "--filter", f"label={RUN_LABEL}={run}",
                             "--format", "{{.Names}}"], capture_output=True, text=True,
                            timeout=ENGINE_TIMEOUT, stdin=subprocess.DEVNULL)
    names = listed.stdout.split()
    if names:
        force_remove(engine, names)
    return names


def force_remove(engine: str, names: Sequence[str]) -> None:
    """Kills and removes containers now (`rm --force` alone gives podman's a stop timeout
    first); one at a time, as a name that is gone fails the whole command (an engine's `--rm`
    may remove one meanwhile)."""
    for name in names:
        for command in (("kill", name), ("rm", "--force", name)):
            subprocess.run([engine, *command], capture_output=True, timeout=ENGINE_TIMEOUT,
                           stdin=subprocess.DEVNULL)


class _Wrapper:
    """Runs one member's container; SIGTERM/SIGINT/SIGHUP stop and remove it."""

    def __init__(self, spec: ContainerSpec, environ: Mapping[str, str]) -> None:
        self.spec = spec
        self.name = spec.name(environ)
        self.env = spec.environment(environ)
        self.client_env = {**environ, **self.env}
        self._client: subprocess.Popen[bytes] | None = None
        self._stop_asked = False
        self._stopping = threading.Lock()

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        force_remove(self.spec.engine, [self.name])  # a leftover of this member's earlier run
        if self._stop_asked:
            return 128 + signal.SIGTERM
        # The client runs in a session of its own (the job's signals to this process group
        # reach the container through `stop` alone, once, with the grace), and dies with this
        # wrapper: a client that outlived it would hold the launcher's output pipe open, and
        # the job would wait on that launcher forever.
        self._client = subprocess.Popen(self.spec.run_argv(self.name, list(self.env)), env=self.client_env,
                                        stdin=subprocess.DEVNULL, start_new_session=True,
                                        preexec_fn=_die_with_parent)
        if self._stop_asked:
            self._stop_in_background()
        code = self._client.wait()
        force_remove(self.spec.engine, [self.name])  # `--rm` does it, unless the client was killed
        return code

    def _on_signal(self, *_: object) -> None:
        self._stop_asked = True
        if self._client is not None:
            self._stop_in_background()

    def _stop_in_background(self) -> None:
        threading.Thread(target=self.stop, daemon=True).start()

    def stop(self) -> None:
        """`ENGINE stop`: the image's stop signal, SIGKILL after STOP_GRACE seconds."""
        if self._stopping.acquire(blocking=False):
            subprocess.run([self.spec.engine, "stop", "-t", str(STOP_GRACE), self.name],
                           capture_output=True, timeout=ENGINE_TIMEOUT, stdin=subprocess.DEVNULL)


def _die_with_parent() -> None:
    """In the engine client before it runs: SIGKILL when the wrapper dies (Linux's
    PR_SET_PDEATHSIG = 1). Safe as a `preexec_fn` here: no thread runs before the client
    starts (the stop thread starts only once it exists)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m paddlecloud.backends.local.container SPEC_JSON", file=sys.stderr)
        return 2
    return _Wrapper(ContainerSpec.from_json(argv[0]), os.environ).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
