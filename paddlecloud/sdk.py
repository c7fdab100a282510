"""The Python API: `PaddleJob(...)`, `.submit()` to a Job Server, and `dist_train`.

PaddlePaddle cloud's design, with today's PaddlePaddle: a `PaddleJob` holds the
design's parameters (it is `paddlecloud.jobrequest.TrainerJob`, validated at
construction by the same `JobSpec.validate` as `job submit`, errors naming the
value); `submit(server=URL, token=...)` zips the package directory, uploads it
(`POST /v1/package`) and submits (`POST /v1/trainer/job`) — or, without a server,
creates the job straight on Kubernetes with the user's kubeconfig, as `job submit`
does — returning a `JobHandle`
with `status()`, `logs()`, `delete()` and `wait()` (a rich progress bar in a terminal or a
Jupyter notebook, plain lines elsewhere, e.g. logs and pipes). `dist_train`, in seed
001's signature, submits when `PADDLE_NOTEBOOK=YES` and otherwise trains here: a trainer
object in this process (Paddle v2's `train` shape, or a `paddle.Model`), a module through
`paddlecloud local train`'s `LocalJob`. A submit through a server waits for the server's image build:
`SUBMIT_TIMEOUT_S` is above the longest build the server may wait for.

Only the standard library is imported here; `rich` and the local runner load
when used, so `import paddlecloud` stays light.

What this does NOT guarantee: `wait()` polls (every `interval` seconds) and can
miss a phase that lasted less.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import json
import logging
import os
import time
import uuid
import zipfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from paddlecloud.epoch_text import epoch_of
from paddlecloud.jobrequest import TrainerJob
from paddlecloud.jobspec import DEFAULT_ETCD_ENDPOINTS, JobSpec, JobSpecError
from paddlecloud.phase import TERMINAL
from paddlecloud.trainer_package import ENTRY_SCRIPTS, EntryPoint, entry_point, package_paths

logger = logging.getLogger(__name__)

NOTEBOOK_ENV = "PADDLE_NOTEBOOK"
# The server answers a submit once the job's image is built, and waits for a build at most
# its build.timeout_s (paddlecloud.backends.k8s.image_build.MAX_BUILD_TIMEOUT_S, 3000 s, at most): the
# submit waits longer, so it never gives up while the server goes on and creates the job.
SUBMIT_TIMEOUT_S = 3600.0
REQUEST_TIMEOUT_S = 600.0  # every other request


class JobServerError(RuntimeError):
    """The Job Server refused a request; the message is its answer."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


# Stands in for a module not known yet while the rest of a PaddleJob is validated: the entry
# point may come later, from `dist_train`'s trainer; `_with_entry_point` refuses a job without.
_ENTRY_POINT_LATER = "entry_point_later"


@dataclasses.dataclass(frozen=True)
class PaddleJob(TrainerJob):
    """A job in PaddlePaddle cloud's parameters, validated when made (see `TrainerJob`).

    As seed 001 writes it: `input` and `output` a path or URL string (or a list: one
    output), `volume` a claim mounted at `/VOLUME`, and `trainer_package` the entry
    point: a package directory (its `train.py` or `trainer.py`, unless `module` names
    the module) or the script itself. Without either, `dist_train` takes the module from
    its trainer, and `submit` refuses the job naming what is missing.
    """

    module: str = dataclasses.field(default="", metadata={
        "doc": "Trainers run `python -m MODULE` (default: from trainer_package)."})

    def __post_init__(self) -> None:
        object.__setattr__(self, "input", _paths("input", self.input))
        object.__setattr__(self, "output", _one_path("output", self.output))
        module, package = _entry_point(self.module, self.trainer_package)
        object.__setattr__(self, "module", module)
        object.__setattr__(self, "trainer_package", package)
        # every other value, checked now, naming the first bad one (JobSpecError)
        TrainerJob.to_spec(dataclasses.replace(self._as_request(), module=module or _ENTRY_POINT_LATER))

    def _as_request(self) -> TrainerJob:
        return TrainerJob(**{f.name: getattr(self, f.name) for f in dataclasses.fields(TrainerJob)})

    def _with_entry_point(self) -> PaddleJob:
        """This job, its entry point checked against its package before anything starts."""
        if not self.module:
            raise JobSpecError(
                f"PaddleJob {self.job_name!r} has no entry point: give trainer_package (a package "
                f"directory holding {' or '.join(ENTRY_SCRIPTS)}, or the script) or module=")
        self._entry()
        return self

    def _entry(self) -> EntryPoint | None:
        """Where `module` is in the package directory (None: no package); `JobSpecError` naming
        both forms looked for otherwise (the base image is PaddlePaddle's, seed 001: the
        trainer's code is the package's)."""
        if not self.trainer_package or not Path(self.trainer_package).is_dir():
            return None
        folder = Path(self.trainer_package)
        return entry_point(self.module, package_paths(folder), folder=folder.absolute().name,
                           where=f"trainer_package {self.trainer_package!r}")

    def _placed_files(self) -> dict[str, bytes]:
        """The package's files as the pods import them (under the folder's name when it is the
        module's top package: seed 002's `--module=demo.train` of `./demo`)."""
        files = self.package_files()
        entry = self._entry()
        return entry.placed(files) if entry is not None else files

    def package_files(self) -> dict[str, bytes]:
        """The package directory's files (hidden files and caches skipped, as `job submit`)."""
        from paddlecloud.backends.k8s.jobs import read_package

        return read_package(Path(self.trainer_package))

    def package_archive(self) -> bytes:
        """The package as a zip (an empty requirements.txt added when it has none)."""
        files = self._placed_files()
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in sorted(files):
                archive.writestr(path, files[path])
            if "requirements.txt" not in files:
                archive.writestr("requirements.txt", "")
        return out.getvalue()

    def submit(self, *, server: str | None = None, token: str | None = None,
               kubeconfig: str | None = None, timeout: float = SUBMIT_TIMEOUT_S) -> JobHandle:
        """Submits through the Job Server at `server` (with `token`, waiting at most `timeout`
        seconds for its answer, image build included), or, without `server`, straight to
        Kubernetes with the user's kubeconfig, as `paddlecloud job submit` does."""
        self._with_entry_point()
        if server:
            if not token:
                raise ValueError("submit(server=...) needs token=")
            if not timeout > 0:
                raise ValueError(f"submit timeout must be above 0 seconds, got {timeout!r}")
            return self._submit_to_server(_Client(server, token), timeout=timeout)
        return self._submit_to_kubernetes(kubeconfig)

    def _submit_to_server(self, client: _Client, *, timeout: float) -> JobHandle:
        body = {f.name: getattr(self, f.name) for f in dataclasses.fields(TrainerJob)}
        body["input"], body["env"] = list(self.input), dict(self.env)
        if body["etcd_endpoints"] == DEFAULT_ETCD_ENDPOINTS:  # not chosen: the server's own
            del body["etcd_endpoints"]  # (a server with other etcd refuses any it does not allow)
        if self.trainer_package:
            body["trainer_package"] = client.upload(self.package_archive())["digest"]
        made = client.request("POST", "/v1/trainer/job", body, timeout=timeout)
        return JobHandle(_ServerBackend(client), name=made["name"], namespace=made["namespace"])

    def _submit_to_kubernetes(self, kubeconfig: str | None) -> JobHandle:
        from paddlecloud.backends.k8s import manifests
        from paddlecloud.backends.k8s.client import load_api_client
        from paddlecloud.backends.k8s.jobs import create_job, create_paddlejob

        files = self._placed_files() if self.trainer_package else None
        spec = self.to_spec(package_path=str(Path(self.trainer_package).absolute()) if files else "",
                            package_files=tuple(sorted(files)) if files else ())
        objects = manifests.submit_objects(spec, files)
        manifests.master_objects(spec, None)  # renders the pods now: template errors surface here
        api = load_api_client(kubeconfig)
        if spec.local_queue:  # Kueue admits it: a PaddleJob the operator runs
            create_paddlejob(api, spec=spec)
        else:
            create_job(api, spec=spec, objects=objects)
        return JobHandle(_KubernetesBackend(api), name=spec.name, namespace=spec.namespace)


def submit_spec(spec: JobSpec, *, server: str, token: str, namespace: str | None) -> JobHandle:
    """Submits a `JobSpec` (`job submit --server`) through the Job Server; `namespace` None:
    the token's default. Raises `JobSpecError` for settings the server's API cannot carry."""
    job = TrainerJob.from_spec(spec)
    fields = {f.name: getattr(job, f.name) for f in dataclasses.fields(TrainerJob)}
    return PaddleJob(**{**fields, "namespace": namespace or ""}).submit(server=server, token=token)


class JobHandle:
    """A submitted job: ask its status, wait for it, delete it."""

    def __init__(self, backend: _ServerBackend | _KubernetesBackend, *, name: str,
                 namespace: str) -> None:
        self._backend, self.name, self.namespace = backend, name, namespace

    def status(self) -> dict[str, Any]:
        """Phase, pods per role and the master's progress (as `GET /v1/jobs/NAME`)."""
        return self._backend.status(self.name, self.namespace)

    def logs(self, *, role: str = "trainer", index: int = 0, tail: int = 200) -> str:
        """The last `tail` lines of one pod's log (trainer `index`, pserver `index`, master)."""
        return self._backend.logs(self.name, self.namespace, role=role, index=index, tail=tail)

    def delete(self) -> list[str]:
        """Deletes the job; returns what went."""
        return self._backend.delete(self.name, self.namespace)

    def wait(self, *, interval: float = 5.0, timeout: float | None = None) -> dict[str, Any]:
        """Polls until the job ends; shows progress; returns the last status."""
        deadline = None if timeout is None else time.monotonic() + timeout
        show = _progress_view(_console())
        try:
            while True:
                status = self.status()
                show(status)
                if status["phase"] in {p.value for p in TERMINAL}:
                    return status
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"job {self.name} still {status['phase']} after {timeout}s")
                time.sleep(interval)
        finally:
            show(None)


class _ServerBackend:
    def __init__(self, client: _Client) -> None:
        self.client = client

    def status(self, name: str, namespace: str) -> dict[str, Any]:
        return self.client.request("GET", f"/v1/jobs/{name}?namespace={namespace}")

    def logs(self, name: str, namespace: str, *, role: str, index: int, tail: int) -> str:
        return self.client.text(f"/v1/jobs/{name}/logs?namespace={namespace}"
                                f"&role={role}&index={index}&tail={tail}")

    def delete(self, name: str, namespace: str) -> list[str]:
        return self.client.request("DELETE", f"/v1/jobs/{name}?namespace={namespace}")["deleted"]


class _KubernetesBackend:
    """The same answers as the server's, read with the user's own credentials."""

    def __init__(self, api: Any) -> None:
        self.api = api

    def status(self, name: str, namespace: str) -> dict[str, Any]:
        from paddlecloud.backends.k8s.jobs import job_status

        found = job_status(self.api, namespace=namespace, name=name)
        if found is None:
            raise LookupError(f"job {name} not found in namespace {namespace}")
        return found

    def logs(self, name: str, namespace: str, *, role: str, index: int, tail: int) -> str:
        from paddlecloud.backends.k8s.jobs import pod_log

        text = pod_log(self.api, name=name, namespace=namespace, role=role, index=index,
                       tail_lines=tail)
        if text is None:
            raise LookupError(f"no {role} pod with index {index} for job {name} in {namespace}")
        return text

    def delete(self, name: str, namespace: str) -> list[str]:
        from paddlecloud.backends.k8s.jobs import delete_job

        return delete_job(self.api, namespace=namespace, name=name)


def _console() -> Any:
    from rich.console import Console

    return Console()


def _shows_bar(console: Any, *, widgets: bool) -> bool:
    """Whether `wait()` draws a live bar on `console` (a rich Console): in a terminal, or in a
    Jupyter notebook where ipywidgets is installed (rich draws it in an output widget there,
    and without one only warns); logs and pipes get plain lines."""
    return bool(console.is_terminal or (console.is_jupyter and widgets))


def _progress_view(console: Any) -> Callable[[dict[str, Any] | None], None]:
    """A rich progress bar where `_shows_bar`, plain lines elsewhere; None closes it."""
    import importlib.util

    if _shows_bar(console, widgets=importlib.util.find_spec("ipywidgets") is not None):
        from rich.progress import Progress

        bar = Progress(console=console)
        bar.start()
        task = bar.add_task("pending", total=None)

        def rich_view(status: dict[str, Any] | None) -> None:
            if status is None:
                bar.stop()
                return
            p = status.get("progress") or {}
            bar.update(task, description=status["phase"], total=p.get("tasks") or None,
                       completed=p.get("tasks_done", 0))
        return rich_view

    last: list[str] = []

    def plain_view(status: dict[str, Any] | None) -> None:
        if status is None:
            return
        p = status.get("progress") or {}
        line = (f"{status['name']}: {status['phase']}" + (
            f", {epoch_of(p['epoch'], p['epochs'])}, tasks {p['tasks_done']}/{p['tasks']}" if p else ""))
        if last != [line]:
            print(line, file=console.file, flush=True)
            last[:] = [line]
    return plain_view


class _Client:
    """JSON over HTTP to a Job Server, with its bearer token (standard library only)."""

    def __init__(self, server: str, token: str) -> None:
        self.server, self.token = server.rstrip("/"), token

    def _send(self, method: str, path: str, *, data: bytes | None, content_type: str,
              as_json: bool = True, timeout: float = REQUEST_TIMEOUT_S) -> Any:
        import urllib.error
        import urllib.request

        request = urllib.request.Request(self.server + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": content_type})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                body = response.read()
                return json.loads(body) if as_json else body.decode("utf-8", errors="replace")
        except TimeoutError:
            # the server goes on: a submit may still build the image and create the job
            raise TimeoutError(f"{method} {path}: no answer from {self.server} in {timeout:g}s; "
                               "the server may still finish the request (a submit: build the "
                               "image and create the job, see GET /v1/jobs)") from None
        except urllib.error.HTTPError as error:
            detail = error.read().decode("utf-8", errors="replace")
            try:
                detail = json.loads(detail).get("detail", detail)
            except (ValueError, AttributeError):
                pass
            raise JobServerError(f"{method} {path}: {error.code}: {detail}", status=error.code) from None

    def request(self, method: str, path: str, body: Any = None, *,
                timeout: float = REQUEST_TIMEOUT_S) -> Any:
        data = None if body is None else json.dumps(body).encode()
        return self._send(method, path, data=data, content_type="application/json",
                          timeout=timeout)

    def text(self, path: str) -> str:
        return self._send("GET", path, data=None, content_type="text/plain", as_json=False)

    def upload(self, archive: bytes) -> Any:
        boundary = uuid.uuid4().hex
        data = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
                f"filename=\"package.zip\"\r\nContent-Type: application/zip\r\n\r\n").encode()
        data += archive + f"\r\n--{boundary}--\r\n".encode()
        return self._send("POST", "/v1/package", data=data,
                          content_type=f"multipart/form-data; boundary={boundary}")


def _paths(name: str, value: Any) -> tuple[str, ...]:
    """A path or URL string, or a list of them, as a tuple; a clear error naming anything else."""
    if isinstance(value, str | os.PathLike):
        return (os.fspath(value),)
    try:
        paths = tuple(value)
    except TypeError:
        raise JobSpecError(f"invalid {name} {value!r}: give a path or URL, or a list of them") from None
    bad = [p for p in paths if not isinstance(p, str | os.PathLike)]
    if bad:
        raise JobSpecError(f"invalid {name} {bad[0]!r}: give a path or URL, or a list of them")
    return tuple(os.fspath(p) for p in paths)


def _one_path(name: str, value: Any) -> str:
    paths = _paths(name, value) if value else ("",)
    if len(paths) != 1:
        raise JobSpecError(f"invalid {name} {list(paths)[:3]!r}: a job writes to one {name} "
                           "directory")
    return paths[0]


def _entry_point(module: str, package: str) -> tuple[str, str]:
    """(module, package directory) of `trainer_package`, seed 001's "entry point": a script
    is its directory and its name; a directory with no `module` runs its train.py or
    trainer.py (neither: no module yet)."""
    if not package:
        return module, package
    path = Path(package)
    if path.suffix == ".py":
        if not path.is_file():
            raise JobSpecError(f"invalid trainer_package {package!r}: no such script")
        return module or path.stem, str(path.parent)
    if not module and path.is_dir():
        try:
            return entry_point("", package_paths(path), folder=path.absolute().name).module, package
        except JobSpecError:
            return "", package  # dist_train's trainer may name it; submit refuses a job without
    return module, package


def _module_of(train: str | ModuleType | Callable[..., Any]) -> str:
    """The module trainers run: a name, a module, or the (importable) module of a function."""
    if isinstance(train, str):
        return train
    name = train.__name__ if isinstance(train, ModuleType) else getattr(train, "__module__", "")
    if not name or name == "__main__":
        raise ValueError(f"{train!r} is defined in __main__: put it in a module the trainers can "
                         "import (e.g. in trainer_package) and pass it or its name")
    return name


def _names_a_program(trainer: Any) -> bool:
    """`trainer` names the program to run (a module name, a module, a function), rather than
    being a trainer object to call here."""
    return isinstance(trainer, str | ModuleType) or inspect.isfunction(trainer)


@dataclasses.dataclass(frozen=True)
class EndIteration:
    """`event_handler`'s event after each batch (Paddle v2's `paddle.event.EndIteration`)."""

    pass_id: int
    batch_id: int
    metrics: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class EndPass:
    """`event_handler`'s event after each pass (Paddle v2's `paddle.event.EndPass`)."""

    pass_id: int
    metrics: dict[str, Any]


def dist_train(trainer: Any = None, reader: Any = None, num_passes: int = 1,
               event_handler: Callable[[Any], None] | None = None, feeding: Any = None,
               paddle_job: PaddleJob | None = None, *, server: str | None = None,
               token: str | None = None) -> Any:
    """Seed 001's `paddle.dist_train`: with PADDLE_NOTEBOOK=YES, submit `paddle_job` (server
    and token default to PADDLE_JOB_SERVER and PADDLE_JOB_TOKEN) and return its handle;
    otherwise train here.

    `trainer` is what trains. A module name, a module or a function names the program the
    job's trainers run (`python -m` its module; here through `paddlecloud local train`,
    returning its exit code). An object trains here, in this process, as the seed's pseudo
    code does: one with `train` (Paddle v2's `paddle.trainer.SGD` shape) is called as
    `trainer.train(reader, num_passes, event_handler, feeding)`; today's `paddle.Model` is
    called as `trainer.fit(reader, epochs=num_passes)`, `event_handler` getting `EndIteration`
    and `EndPass` events (a `feeding` has no place there: `paddle.Model` takes its inputs
    when made). Submitted, the job runs its entry point (`trainer_package` or `module`) in
    the pods, which read their own data or the master's: `reader` and `feeding` belong to
    that program then.
    """
    if os.environ.get(NOTEBOOK_ENV, "").upper() == "YES":
        if paddle_job is None:
            raise ValueError("PADDLE_NOTEBOOK=YES submits paddle_job: give paddle_job=PaddleJob(...)")
        job = paddle_job
        if _names_a_program(trainer):
            job = dataclasses.replace(paddle_job, module=_module_of(trainer))
        server = server or os.environ.get("PADDLE_JOB_SERVER")
        token = token or os.environ.get("PADDLE_JOB_TOKEN")
        if not server or not token:
            raise ValueError("PADDLE_NOTEBOOK=YES submits to a Job Server: give server= and "
                             "token= (or PADDLE_JOB_SERVER and PADDLE_JOB_TOKEN)")
        return job.submit(server=server, token=token)
    if trainer is None or _names_a_program(trainer):
        if paddle_job is None:
            raise ValueError("dist_train needs a trainer object to call here, or paddle_job= "
                             "to run its program locally")
        job = paddle_job if trainer is None else dataclasses.replace(
            paddle_job, module=_module_of(trainer))
        return _train_locally(job._with_entry_point())
    return _train_here(trainer, reader, num_passes, event_handler, feeding)


def _train_here(trainer: Any, reader: Any, num_passes: int,
                event_handler: Callable[[Any], None] | None, feeding: Any) -> Any:
    if callable(getattr(trainer, "train", None)):
        return trainer.train(reader, num_passes, event_handler, feeding)
    if callable(getattr(trainer, "fit", None)):
        if feeding is not None:
            raise ValueError("feeding maps a reader's columns onto Paddle v2's data layers; a "
                             "paddle.Model takes its inputs when made (inputs=): drop feeding")
        callbacks = [_event_callback(event_handler)] if event_handler is not None else None
        return trainer.fit(reader, epochs=num_passes, callbacks=callbacks, verbose=0)
    raise TypeError(f"cannot train with {type(trainer).__name__}: give an object with train() "
                    "(Paddle v2's SGD) or fit() (paddle.Model), or a module to run")


def _event_callback(event_handler: Callable[[Any], None]) -> Any:
    """A `paddle.callbacks.Callback` that hands `event_handler` Paddle v2's events."""
    from paddle.callbacks import Callback

    class Events(Callback):
        pass_id = 0

        def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
            self.pass_id = epoch

        def on_train_batch_end(self, step: int, logs: dict | None = None) -> None:
            event_handler(EndIteration(self.pass_id, step, dict(logs or {})))

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            event_handler(EndPass(epoch, dict(logs or {})))

    return Events()


def _train_locally(job: PaddleJob) -> int:
    import asyncio

    from paddlecloud.backends.local.job import LocalJob, LocalJobSpec

    entry = job._entry()
    output = Path(job.output or f"./{job.job_name}-output").absolute()
    output.mkdir(parents=True, exist_ok=True)
    spec = LocalJobSpec(
        job=job.job_name, module=job.module, output=output, inputs=tuple(job.input),
        trainers=job.trainers, pservers=job.pservers, epochs=job.epochs,
        package_path=Path(job.trainer_package).absolute() if job.trainer_package else None,
        package_import_root=(Path(job.trainer_package).absolute().parent
                             if entry is not None and entry.top_package else None),
        env=tuple(sorted(dict(job.env).items())), shuffle_seed=job.shuffle_seed,
        restart_mode="group" if job.pservers == 0 else "trainer",
    )

    def line(source: str, text: str) -> None:
        print(f"[{source}] {text}", flush=True)

    return asyncio.run(LocalJob(spec, on_line=line, on_progress=lambda progress: None).run())
