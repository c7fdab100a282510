"""`paddlecloud local train`: a whole job on this machine (flags of the PaddlePaddle client design).

Every flag is checked here, before anything starts, with the parsers and checks the master
uses (`paddlecloud.units`, `paddlecloud.datasets`, etcd's lease minimum): a bad value is one
usage error naming it (exit 2) and leaves no etcd, no process and no log behind. Arguments
for the user's module go after `--`; any other leftover argument is refused, since it is
most often the rest of an `--input` glob the shell expanded (the job would otherwise train
on the first file only).

What this does NOT check: that the module runs, that the data parses in `--format`, or
that an fsspec URL is reachable — the trainers and the master find that out.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import click

from paddlecloud.backends.local.container import (
    ENGINES,
    ContainerSpec,
    EngineError,
    check_image,
    check_module,
    find_engine,
    job_mounts,
    package_mounts,
    run_python_in_image,
)
from paddlecloud.cli.spec_options import local_options
from paddlecloud.clitypes import DURATION, ENV_PAIR, POSITIVE, SIZE, SeedSpellings
from paddlecloud.datasets import FORMATS, SpecError, list_files
from paddlecloud.etcd import MIN_LEASE_TTL
from paddlecloud.goodput_text import summarize_trainer_seconds
from paddlecloud.jobfields import JobSpecError
from paddlecloud.trainer_package import EntryPoint, entry_point, package_paths

EXAMPLES = {"fit-a-line": "examples.fit_a_line"}


def _job_name(module: str) -> str:
    base = module.rsplit(".", 1)[0] if module.endswith(".train") else module
    name = re.sub(r"[^a-z0-9-]+", "-", base.rsplit(".", 1)[-1].lower()).strip("-")
    return name or "job"


def _importable(module: str, package_path: Path | None) -> bool:
    """Whether this Python finds `module` with `package_path` first on its path."""
    if package_path is not None:
        sys.path.insert(0, str(package_path))
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
    finally:
        if package_path is not None:
            sys.path.remove(str(package_path))


def _check_module(module: str, package_path: Path | None) -> None:
    if not _importable(module, package_path):
        where = f" under --package-path {package_path}" if package_path else ""
        raise click.BadParameter(f"module {module!r} not found{where}", param_hint="'--module'")


def _package_entry(module: str | None, package_path: Path, *, image: str | None) -> EntryPoint | None:
    """The module in --package-path, in either form (the folder as the import root, or as the
    module's top package: seed 002's --package-path=./demo --module=demo.train), or its
    train.py / trainer.py without --module; None for a module found elsewhere: installed here,
    or (for the image's check) maybe in --image."""
    try:
        return entry_point(module or "", package_paths(package_path),
                           folder=package_path.absolute().name,
                           where=f"--package-path {str(package_path)[:200]}")
    except JobSpecError as error:
        if module and (image or _importable(module, package_path)):
            return None
        raise click.BadParameter(str(error), param_hint="'--module'") from None


def _check_image_module(container: ContainerSpec, module: str, *, package_path: Path | None,
                        top_package: bool) -> None:
    """The module found in a container of --image with --package-path mounted as the job's
    will be, before anything starts (else the trainers fail at once, restart after restart)."""
    mounts = package_mounts(package_path.absolute(), top_package=top_package) if package_path else ()
    try:
        check_module(dataclasses.replace(container, mounts=mounts), module)
    except EngineError as error:
        raise click.BadParameter(str(error), param_hint="'--module'") from None


def _expand_inputs(inputs: tuple[str, ...]) -> tuple[str, ...]:
    """Local paths made absolute; every glob must match (the master would refuse it anyway)."""
    absolute = tuple(p if "://" in p else str(Path(p).expanduser().absolute()) for p in inputs)
    try:
        list_files(absolute)
    except SpecError as error:
        raise click.BadParameter(str(error), param_hint="'--input'") from None
    return absolute


_AFTER_DASHES = "paddlecloud.after_dashes"
_GLOB_CHARS = re.compile(r"[*?\[]")


class _TrainCommand(SeedSpellings):
    """Remembers the arguments after `--`: only those are the module's (click drops the `--`)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta[_AFTER_DASHES] = args[args.index("--") + 1:] if "--" in args else []
        return super().parse_args(ctx, args)


def _check_leftovers(module_args: tuple[str, ...], inputs: tuple[str, ...]) -> None:
    """Refuses arguments given without `--`: they are most often an unquoted glob's expansion."""
    after = click.get_current_context().meta.get(_AFTER_DASHES, [])
    given = len(module_args) - len(after)
    stray = module_args if given < 0 or tuple(module_args[given:]) != tuple(after) else module_args[:given]
    if not stray:
        return
    literal = [Path(p) for p in inputs if "://" not in p and not _GLOB_CHARS.search(p)]
    expanded = [a for a in stray if Path(a).exists()
                and any(Path(a).parent == p.parent and Path(a).suffix == p.suffix for p in literal)]
    if expanded:
        first = next(p for p in literal if any(Path(a).parent == p.parent for a in expanded))
        pattern = str(first.parent / f"*{first.suffix}")
        more = f" (and {len(stray) - 1} more)" if len(stray) > 1 else ""
        raise click.UsageError(
            f"{expanded[0]!r}{more} came after --input {str(first)!r}: the shell "
            f"expanded an unquoted glob and only its first file would be trained on; quote the glob, "
            f"e.g. --input {pattern!r}")
    raise click.UsageError(
        f"unexpected argument {stray[0]!r}: arguments for the module go after '--' "
        "(e.g. -- --lr 0.1); an --input glob must be quoted (--input 'data/*.csv')")


def _check_example(example: str, **dropped: Any) -> None:
    given = [f"--{name.replace('_', '-')}" for name, value in dropped.items() if value]
    if given:
        raise click.UsageError(
            f"--example {example} brings its own module and data: drop {' and '.join(given)}, "
            f"or drop --example to run your own")


def _check_job_name(name: str | None) -> None:
    """The name becomes etcd keys, file names and PADDLE_JOB_NAME: no '/', nothing empty."""
    if name is not None and (not name.strip() or "/" in name):
        raise click.BadParameter(f"invalid job name {name!r}: give a non-empty name without '/'",
                                 param_hint="'--job'")


def _check_trainer_range(trainers: int | None, minimum: int | None, maximum: int | None) -> int:
    """The desired size at start; a range that cannot be is a usage error naming it."""
    from paddlecloud.elastic import RangeError, TrainerRange

    if trainers is None and minimum is None and maximum is None:
        return 1
    try:
        return TrainerRange.of(trainers=trainers, minimum=minimum, maximum=maximum)[1]
    except RangeError as error:
        raise click.BadParameter(str(error), param_hint="'--trainers/--min-trainers/--max-trainers'") from None


def _check_schedule(text: str | None) -> tuple[tuple[float, int], ...]:
    from paddlecloud.elastic import RangeError, parse_schedule

    if not text:
        return ()
    try:
        return parse_schedule(text)
    except RangeError as error:
        raise click.BadParameter(str(error), param_hint="'--resize-schedule'") from None


def _check_session_ttl(seconds: float) -> None:
    if seconds < MIN_LEASE_TTL:
        raise click.BadParameter(f"--session-ttl {seconds:g}s is too short: etcd leases need at least "
                                 f"{MIN_LEASE_TTL:g}s",
                                 param_hint="'--session-ttl'")


def _check_container(image: str, engine: str | None) -> ContainerSpec:
    """The engine found and the image present locally, before anything starts; the job's
    name and mounts are filled in once the other flags are checked."""
    try:
        found = find_engine(engine)
        check_image(found, image)
    except EngineError as error:
        raise click.BadParameter(str(error), param_hint="'--image'") from None
    return ContainerSpec(engine=found, image=image, job="", run=uuid.uuid4().hex[:12])


def _python(path: Path | None) -> str:
    """The interpreter of the user's module: `--python` (checked to run), else this one."""
    if path is None:
        return sys.executable
    try:
        subprocess.run([str(path), "-c", "pass"], check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as error:
        raise click.BadParameter(f"{str(path)[:200]!r} does not run Python: {error}",
                                 param_hint="'--python'") from None
    return str(path.absolute()) if path.parent != Path() else str(path)


def _check_ps_paddle(*, python: str, given: bool, module: str | None, package_path: Path | None,
                     container: ContainerSpec | None) -> None:
    """Refuses a PS job whose PaddlePaddle has no parameter-server core (paddle >= 3.1.1),
    before anything starts: the image's, or `python`'s when the module imports paddle."""
    from paddlecloud.paddle_probe import PROBE, imports_paddle, refusal

    if container is not None:
        try:
            output = run_python_in_image(container.engine, container.image, PROBE)
        except EngineError as error:
            raise click.BadParameter(str(error), param_hint="'--image'") from None
        error = refusal(output, where=f"image {container.image[:200]}", required=False)
        hint = "'--image'"
    else:
        if module is None or not imports_paddle(_module_source(module, package_path)):
            return  # not Paddle's fleet PS (a program of its own pservers)
        result = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=120)
        where = f"--python {python}" if given else f"{python}, the Python of this paddlecloud"
        error = refusal(result.stdout + result.stderr[-300:], where=where, required=True)
        hint = "'--python'"
    if error:
        raise click.BadParameter(error, param_hint=hint)


def _module_source(module: str, package_path: Path | None) -> str:
    if package_path is not None:
        sys.path.insert(0, str(package_path))
    try:
        found = importlib.util.find_spec(module)
    finally:
        if package_path is not None:
            sys.path.remove(str(package_path))
    if found is None or not found.origin or not found.has_location:
        return ""
    try:
        return Path(found.origin).read_text(errors="replace")
    except OSError:
        return ""


def _make_output(output: Path) -> None:
    """Creates `--output` and writes a file in it now, so a path that cannot be written is a
    usage error rather than a traceback once etcd runs (a permission check alone would pass
    for root)."""
    try:
        output.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=output):
            pass
    except OSError as error:
        raise click.BadParameter(f"cannot write in {str(output)!r}: {error.strerror or error}",
                                 param_hint="'--output'") from None


def _check_etcd(endpoints: str) -> None:
    from paddlecloud import etcd

    async def probe() -> None:
        client = await etcd.connect(endpoints, timeout=5)
        await client.close()

    try:
        asyncio.run(probe())
    except (etcd.EtcdUnavailable, ValueError) as error:
        raise click.BadParameter(str(error), param_hint="'--etcd-endpoints'") from None


def _example_module(name: str) -> tuple[str, Path]:
    """The example's trainer module and its package path (this checkout)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / EXAMPLES[name].replace(".", "/")).is_dir():
        raise click.UsageError(f"the {name} example ships with the source checkout; {root} has no examples/")
    return f"{EXAMPLES[name]}.train", root


def _example_data(name: str, *, root: Path, output: Path) -> tuple[str, ...]:
    """The example's data in `output/data`, generated once; its glob as the job's input."""
    data = output / "data"
    if not any(data.glob("*.csv")):
        click.echo(f"generating the {name} example's data in {data}", err=True)
        subprocess.run([sys.executable, "-m", f"{EXAMPLES[name]}.data", str(data)], cwd=root, check=True)
    return (str(data / "*.csv"),)


def _say_complete(job: str, *, checkpoints: Path, start_epoch: int, epochs: int) -> None:
    """What `local train` says of a job its checkpoint shows finished (it starts nothing)."""
    click.echo(f"job {job} is complete: the checkpoint in {checkpoints} is at the end of epoch "
               f"{start_epoch - 1}, and the job's epochs are 0..{epochs - 1}; nothing to train. "
               f"Run it again from the start with --fresh (which discards that checkpoint), or "
               f"train on with --epochs {start_epoch + 1} or more.")


# local train's take on the job model's fields where one machine differs from a cluster:
# local paths and types, an output directory of its own, a private etcd, processes not pods
LOCAL_DIFFERENCES: dict[str, dict[str, Any]] = {
    "name": {"help": "Job name [default: from the module]."},
    "image": {"metavar": "IMAGE", "help": (
        "Run each trainer and pserver in a container of IMAGE (a local image: nothing is pulled), "
        "with --input, --output and --package-path mounted at /train/input, /train/output and "
        "/train/package; the image's entrypoint runs, or `python3 -m MODULE` with --module.")},
    "package_path": {"type": click.Path(exists=True, file_okay=False, path_type=Path), "help": (
        "Directory added to the trainers' PYTHONPATH (the programs find it in PADDLECLOUD_PACKAGE): "
        "MODULE lives in it (--module train for its train.py) or it is MODULE's top package "
        "(./demo with --module demo.train); without --module its train.py or trainer.py runs.")},
    "env": {"type": ENV_PAIR},
    "etcd_endpoints": {"help": "Use this etcd instead of starting a private one."},
    "trainers": {"default": None, "help": "Trainer processes [default: 1; 2 for --example]."},
    "inputs": {"help": "Input path, glob or fsspec URL (repeatable; the programs get them in "
                       "PADDLECLOUD_INPUT)."},
    "output": {"type": click.Path(file_okay=False, path_type=Path), "default": "output",
               "help": "Where logs, checkpoints and the model go; a checkpoint there is resumed from."},
    "data_format": {"type": click.Choice(FORMATS), "default": "lines", "help": (
        "Data format: lines (a record per line; csv, tsv, jsonl and text are its aliases) or file "
        "(a record per file).")},
    "chunk_bytes": {"type": SIZE, "default": "64MiB", "show_default": False},
    "restart_limit": {"show_default": True, "help": "Restarts of a trainer (or of the group)."},
}


@click.group("local")
def local() -> None:
    """Run jobs on this machine."""


@local.command("train", cls=_TrainCommand, context_settings={"show_default": True})
@local_options(LOCAL_DIFFERENCES)
@click.option("--resize-schedule", metavar="SIZE@TIME,...",
              help="Scale the trainers on a timer, e.g. 2@0s,4@20s,1@40s (times since the job started; "
                   "the range defaults to the sizes').")
@click.option("--python", "python_path", type=click.Path(dir_okay=False, path_type=Path),
              help="The Python that runs the module (trainers and pservers) [default: this one], "
                   "e.g. a venv's with a PS-capable PaddlePaddle (2.6.2) for a --pservers job; "
                   "paddlecloud's own launchers stay on this one.")
@click.option("--pserver-module", help="The pservers' module [default: MODULE, which switches on TRAINING_ROLE as PaddlePaddle's PS scripts do].")
@click.option("--checkpoint-every", metavar="TASKS|DURATION",
              help="Checkpoint inside epochs too, every TASKS tasks of the job (20) or DURATION (30s): "
                   "a group restart then resumes mid-epoch (trainers read it from "
                   "PADDLECLOUD_CHECKPOINT_EVERY; see trainer_agent.paddle).")
@click.option("--masters", type=POSITIVE, default=1, help="Master processes; 2 runs a standby.")
@click.option("--fresh", is_flag=True,
              help="Discard the job's earlier state: its keys in etcd and the checkpoints in --output.")
@click.option("--restart", "restart_mode", type=click.Choice(["group", "trainer"]), default=None,
              help="What a dead trainer restarts: the whole group (collective) or itself [default: group without pservers, else trainer].")
@click.option("--pserver-restart", type=click.Choice(["self", "group"]), default="self",
              help="What a dead pserver restarts: itself (its agent starts it again, told to restore "
                   "the last checkpoint) or the PS group: every pserver and trainer from the last "
                   "checkpoint, the master's epoch restarted there (Paddle's fleet PS, whose trainers "
                   "abort when a pserver dies).")
@click.option("--session-ttl", type=DURATION, default="30s", show_default=True,
              help="Trainer session lease (as the master's default: longer than a failover).")
@click.option("--example", type=click.Choice(sorted(EXAMPLES)), help="Run a bundled example (generates its data).")
@click.option("--tls", is_flag=True, help="Masters serve TLS with a CA minted for this run (tokens are always on).")
@click.option("--engine", type=click.Choice(ENGINES), default=None,
              help="The container engine for --image [default: the first of podman and docker on PATH].")
@click.argument("module_args", nargs=-1, type=click.UNPROCESSED)
def train(module, package_path, inputs, output, trainers, min_trainers, max_trainers, resize_schedule, pservers, python_path, pserver_module, env, epochs, checkpoint_every, masters, fresh,
          etcd_endpoints, restart_limit, restart_mode, pserver_restart, job, data_format, chunk_bytes, shuffle_seed, session_ttl, example,
          tls, image, engine, module_args) -> None:
    """Run a training job here: etcd, master(s), pservers and trainers as child processes
    (with --image, each trainer and pserver in a container of IMAGE).

    Quote an --input glob ('data/*.csv'); arguments for MODULE go after `--`.
    """
    from paddlecloud.backends.local.job import JobFailed, LocalJob, LocalJobSpec, resume_epoch
    from paddlecloud.backends.local.view import ConsoleView
    from paddlecloud.checkpoints import CHECKPOINTS_DIR
    from paddlecloud.clitypes import checkpoint_every_env

    _check_leftovers(module_args, inputs)
    if engine and not image:
        raise click.UsageError("--engine chooses the container engine of --image: give --image too")
    if example:
        _check_example(example, module=module, input=inputs, package_path=package_path, image=image)
        module, package_path = _example_module(example)
        trainers = trainers or 2
    elif not module and not image and not package_path:
        raise click.UsageError("Missing option '--module' (or --package-path holding train.py or "
                               "trainer.py, --example, or --image).")
    elif not inputs:
        raise click.UsageError("Missing option '--input': the data to train on.")
    _check_job_name(job)
    _check_session_ttl(session_ttl)
    schedule = _check_schedule(resize_schedule)
    if checkpoint_every:
        env = (*env, checkpoint_every_env(checkpoint_every))
    if schedule:
        sizes = [size for _, size in schedule]
        min_trainers = min_trainers if min_trainers is not None else min(sizes)
        max_trainers = max_trainers if max_trainers is not None else max(sizes)
        if trainers is None and schedule[0][0] == 0:
            trainers = schedule[0][1]
    trainers = _check_trainer_range(trainers, min_trainers, max_trainers)
    for _, size in schedule:
        _check_trainer_range(size, min_trainers, max_trainers)
    entry = None
    if package_path is not None and not example and (module or not image):
        entry = _package_entry(module, package_path, image=image)
        module = entry.module if entry is not None else module
    if image:  # the module is the image's (or the package's) business: it runs in there
        container = _check_container(image, engine)
    else:
        container = None
        if entry is None:  # found in the package by its file already
            _check_module(module, package_path)
        if pserver_module:
            _check_module(pserver_module, package_path)
    if container is not None:  # a module not found in the package by its file: the image's own?
        for wanted in [m for m in (None if entry else module, pserver_module) if m]:
            _check_image_module(container, wanted, package_path=package_path,
                                top_package=bool(entry and entry.top_package))
    if python_path is not None and image:
        raise click.UsageError("--python runs the module on this machine; with --image the image's runs it")
    python = _python(python_path)
    if pservers:
        _check_ps_paddle(python=python, given=python_path is not None, module=pserver_module or module, package_path=package_path,
                         container=container)
    if not example:
        inputs = _expand_inputs(inputs)
    if etcd_endpoints:
        _check_etcd(etcd_endpoints)
    output = output.absolute()
    _make_output(output)
    if example:  # everything checked: only now write anything
        inputs = _example_data(example, root=package_path, output=output)
    if fresh:
        shutil.rmtree(output / CHECKPOINTS_DIR, ignore_errors=True)
    start_epoch = resume_epoch(output)
    job_name = job or _job_name(module or image.rsplit("/", 1)[-1].split(":", 1)[0])
    if start_epoch >= epochs:  # nothing left to train: say so rather than run a job that does nothing
        _say_complete(job_name, checkpoints=output / CHECKPOINTS_DIR, start_epoch=start_epoch,
                      epochs=epochs)
        sys.exit(0)
    if container is not None:
        container = dataclasses.replace(container, job=job_name, env_names=tuple(k for k, _ in env),
                                        mounts=job_mounts(inputs=inputs, output=output,
                                                          package_path=package_path and package_path.absolute(),
                                                          top_package=bool(entry and entry.top_package),
                                                          tls=tls))
    spec = LocalJobSpec(
        job=job_name, module=module, output=output, inputs=inputs,
        trainers=trainers, min_trainers=min_trainers, max_trainers=max_trainers, pservers=pservers,
        resize_schedule=schedule, pserver_module=pserver_module, python=python, epochs=epochs, masters=masters,
        package_path=package_path.absolute() if package_path else None, env=env,
        package_import_root=package_path.absolute().parent if entry and entry.top_package else None,
        module_args=tuple(module_args), etcd_endpoints=etcd_endpoints, fresh=fresh,
        restart_limit=restart_limit, restart_mode=restart_mode or ("group" if pservers == 0 else "trainer"),
        pserver_restart=pserver_restart,
        start_epoch=start_epoch, session_ttl=repr(session_ttl), shuffle_seed=shuffle_seed,
        master_args=("--format", data_format, "--chunk-bytes", str(chunk_bytes)), tls=tls, container=container,
    )
    with ConsoleView() as view:
        if start_epoch:
            view.line("local", f"resuming at epoch {start_epoch} from the checkpoint in {output / CHECKPOINTS_DIR}")
        runner = LocalJob(spec, on_line=view.line, on_progress=view.progress)
        try:
            code = asyncio.run(runner.run())
        except JobFailed as error:
            view.line("local", f"job failed: {error}")
            code = 1
        view.finish()
        verdict = {0: "succeeded", 1: "failed"}.get(code, "interrupted")
        goodput = summarize_trainer_seconds(runner.progress.trainer_seconds)
        view.line("local", f"job {spec.job} {verdict}; logs in {output / 'logs'}"
                  + (f"; {goodput}" if goodput else ""))
    sys.exit(code)
