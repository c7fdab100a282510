"""`paddlecloud local train`: a whole job on this machine (flags of the PaddlePaddle client design)."""

from __future__ import annotations

import asyncio
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import click

from paddlecloud.clitypes import SIZE

EXAMPLES = {"fit-a-line": "examples.fit_a_line"}


def _job_name(module: str) -> str:
    base = module.rsplit(".", 1)[0] if module.endswith(".train") else module
    name = re.sub(r"[^a-z0-9-]+", "-", base.rsplit(".", 1)[-1].lower()).strip("-")
    return name or "job"


def _check_module(module: str, package_path: Path | None) -> None:
    if package_path is not None:
        sys.path.insert(0, str(package_path))
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    finally:
        if package_path is not None:
            sys.path.remove(str(package_path))
    if found is None:
        where = f" under --package-path {package_path}" if package_path else ""
        raise click.BadParameter(f"module {module!r} not found{where}", param_hint="'--module'")


def _expand_inputs(inputs: tuple[str, ...]) -> tuple[str, ...]:
    """Local paths made absolute; every glob must match (the master would refuse it anyway)."""
    from master.config import SpecError
    from paddlecloud.datasets import list_files

    absolute = tuple(p if "://" in p else str(Path(p).expanduser().absolute()) for p in inputs)
    try:
        list_files(absolute)
    except SpecError as error:
        raise click.BadParameter(str(error), param_hint="'--input'") from None
    return absolute


def _parse_env(pairs: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    out = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="'-e'")
        out.append((key, value))
    return tuple(out)


def _check_etcd(endpoints: str) -> None:
    from paddlecloud import etcd

    async def probe() -> None:
        client = await etcd.connect(endpoints, timeout=5)
        await client.close()

    try:
        asyncio.run(probe())
    except (etcd.EtcdUnavailable, ValueError) as error:
        raise click.BadParameter(str(error), param_hint="'--etcd-endpoints'") from None


def _prepare_example(name: str, output: Path) -> tuple[str, Path, tuple[str, ...]]:
    """The example's module, its package path (this checkout) and its data (generated once)."""
    root = Path(__file__).resolve().parents[2]
    package = EXAMPLES[name]
    if not (root / package.replace(".", "/")).is_dir():
        raise click.UsageError(f"the {name} example ships with the source checkout; {root} has no examples/")
    data = output / "data"
    if not any(data.glob("*.csv")):
        click.echo(f"generating the {name} example's data in {data}", err=True)
        subprocess.run([sys.executable, "-m", f"{package}.data", str(data)], cwd=root, check=True)
    return f"{package}.train", root, (str(data / "*.csv"),)


@click.group("local")
def local() -> None:
    """Run jobs on this machine."""


@local.command("train", context_settings={"show_default": True})
@click.option("--module", help="The trainer's Python module, run as `python -m MODULE`.")
@click.option("--package-path", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Directory added to the trainers' PYTHONPATH (where MODULE lives).")
@click.option("--input", "inputs", multiple=True, help="Input path, glob or fsspec URL (repeatable).")
@click.option("--output", type=click.Path(file_okay=False, path_type=Path), default="output",
              help="Where logs, checkpoints and the model go; a checkpoint there is resumed from.")
@click.option("--trainers", type=click.IntRange(min=1), default=None, help="Trainer processes [default: 1; 2 for --example].")
@click.option("--pservers", type=click.IntRange(min=0), default=0, help="Parameter servers (0: collective training).")
@click.option("--pserver-module", help="The pservers' module [default: MODULE, which switches on TRAINING_ROLE as PaddlePaddle's PS scripts do].")
@click.option("-e", "--env", "env_pairs", multiple=True, metavar="KEY=VALUE", help="Environment for trainers and pservers (repeatable).")
@click.option("--epochs", type=click.IntRange(min=1), default=1)
@click.option("--masters", type=click.IntRange(min=1), default=1, help="Master processes; 2 runs a standby.")
@click.option("--fresh", is_flag=True,
              help="Discard the job's earlier state: its keys in etcd and the checkpoints in --output.")
@click.option("--etcd-endpoints", help="Use this etcd instead of starting a private one.")
@click.option("--restart-limit", type=click.IntRange(min=0), default=3, help="Restarts of a trainer (or of the group).")
@click.option("--restart", "restart_mode", type=click.Choice(["group", "trainer"]), default=None,
              help="What a dead trainer restarts: the whole group (collective) or itself [default: group without pservers, else trainer].")
@click.option("--job", "job_name", help="Job name [default: from the module].")
@click.option("--format", "fmt", default="lines", help="Data format: lines (csv, tsv, jsonl, text) or file.")
@click.option("--chunk-bytes", type=SIZE, default="64MiB", help="Chunk size the master cuts files into.")
@click.option("--session-ttl", default="10s", help="Trainer session lease.")
@click.option("--example", type=click.Choice(sorted(EXAMPLES)), help="Run a bundled example (generates its data).")
@click.argument("module_args", nargs=-1, type=click.UNPROCESSED)
def train(module, package_path, inputs, output, trainers, pservers, pserver_module, env_pairs, epochs, masters, fresh,
          etcd_endpoints, restart_limit, restart_mode, job_name, fmt, chunk_bytes, session_ttl, example,
          module_args) -> None:
    """Run a training job here: etcd, master(s), pservers and trainers as child processes."""
    from paddlecloud.checkpoints import CHECKPOINTS_DIR
    from paddlecloud.local.job import JobFailed, LocalJob, LocalJobSpec, resume_epoch
    from paddlecloud.local.view import ConsoleView

    output = output.absolute()
    if example:
        module, package_path, inputs = _prepare_example(example, output)
        trainers = trainers or 2
    if not module:
        raise click.UsageError("Missing option '--module' (or --example).")
    if not inputs:
        raise click.UsageError("Missing option '--input': the data to train on.")
    _check_module(module, package_path)
    if pserver_module:
        _check_module(pserver_module, package_path)
    inputs = _expand_inputs(inputs)
    env = _parse_env(env_pairs)
    if etcd_endpoints:
        _check_etcd(etcd_endpoints)
    if fresh:
        shutil.rmtree(output / CHECKPOINTS_DIR, ignore_errors=True)
    start_epoch = resume_epoch(output)
    spec = LocalJobSpec(
        job=job_name or _job_name(module), module=module, output=output, inputs=inputs,
        trainers=trainers or 1, pservers=pservers, pserver_module=pserver_module, epochs=epochs, masters=masters,
        package_path=package_path.absolute() if package_path else None, env=env,
        module_args=tuple(module_args), etcd_endpoints=etcd_endpoints, fresh=fresh,
        restart_limit=restart_limit, restart_mode=restart_mode or ("group" if pservers == 0 else "trainer"),
        start_epoch=start_epoch, session_ttl=session_ttl,
        master_args=("--format", fmt, "--chunk-bytes", str(chunk_bytes)),
    )
    with ConsoleView() as view:
        if start_epoch:
            view.line("local", f"resuming at epoch {start_epoch} from the checkpoint in {output / CHECKPOINTS_DIR}")
        job = LocalJob(spec, on_line=view.line, on_progress=view.progress)
        try:
            code = asyncio.run(job.run())
        except JobFailed as error:
            view.line("local", f"job failed: {error}")
            code = 1
        verdict = {0: "succeeded", 1: "failed"}.get(code, "interrupted")
        view.line("local", f"job {spec.job} {verdict}; logs in {output / 'logs'}")
    sys.exit(code)
