"""The house's arrows run down: the CLI -> the SDK and the components -> the backends -> the core.

* the core (`paddlecloud/` less the three rooms below): etcd sessions, keys, wire, auth,
  TLS, units, the job model; it imports nothing above it;
* the backends (`paddlecloud/backends/k8s`, `paddlecloud/backends/local`): the core only,
  never each other;
* the SDK (`paddlecloud/sdk.py`) and the components (the master, the agents, the job
  server, the autoscaler, the operator): the core and the backends; a component imports
  nothing of another component (nor reads its package files) and never the SDK;
* the CLI (`paddlecloud/cli/`): anything but the components, whose commands it finds through
  the `paddlecloud.commands` entry points (pyproject.toml).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import tomllib

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
COMPONENTS = ("master", "trainer_agent", "pserver_agent", "job_server", "autoscaler", "pdj_operator")
BACKENDS = ("paddlecloud.backends.k8s", "paddlecloud.backends.local")
SDK = "paddlecloud.sdk"
CLI = "paddlecloud.cli"


def imported(path: Path) -> set[str]:
    """The modules of the house that `path` imports (absolute names), or reads package files of."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module != "paddlecloud":  # `from paddlecloud import etcd` reaches paddlecloud.etcd
                found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "files" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            package = node.args[0].value  # importlib.resources.files("pkg"): the package's files
            found.add("paddlecloud.static" if package == "paddlecloud" else package)
    return {name for name in found if name.split(".")[0] in {"paddlecloud", *COMPONENTS}}


# `python -m paddlecloud` is the CLI's door; the package's own `paddlecloud.PaddleJob` and
# `paddlecloud.dist_train` are the SDK's (loaded on first use: see paddlecloud/__init__.py)
DOORS = {"paddlecloud.__main__": CLI, "paddlecloud": SDK, "paddlecloud.PaddleJob": SDK,
         "paddlecloud.dist_train": SDK}


def room(module: str) -> str:
    """The room a module name belongs to: a component, a backend, the SDK, the CLI or the core."""
    if module in DOORS:
        return DOORS[module]
    top = module.split(".")[0]
    if top in COMPONENTS:
        return top
    for name in (*BACKENDS, SDK, CLI):
        if module == name or module.startswith(name + "."):
            return name
    return "core"


def module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def reached_rooms(package: str) -> dict[str, set[str]]:
    """Per source file under `package`, the rooms other than its own that it reaches."""
    out = {}
    for path in sorted((ROOT / package.replace(".", "/")).rglob("*.py")):
        own = room(module_of(path))
        out[str(path.relative_to(ROOT))] = {room(name) for name in imported(path)} - {own}
    return out


ALLOWED = {
    "core": set(),
    **{backend: {"core"} for backend in BACKENDS},
    SDK: {"core", *BACKENDS},
    **{component: {"core", *BACKENDS} for component in COMPONENTS},
    CLI: {"core", *BACKENDS, SDK},
}


@pytest.mark.parametrize("package", [*COMPONENTS, *BACKENDS, SDK, CLI, "paddlecloud"])
def test_every_arrow_runs_down(package):
    if package == SDK:
        files = {path: {room(n) for n in imported(ROOT / path)} - {SDK}
                 for path in ("paddlecloud/sdk.py", "paddlecloud/__init__.py")}
    else:
        files = reached_rooms(package)
    wrong = {}
    for path, rooms in files.items():
        own = room(module_of(ROOT / path))
        if package == "paddlecloud" and own != "core" and path != "paddlecloud/__main__.py":
            continue  # checked under its own room
        if bad := rooms - ALLOWED[own]:
            wrong[path] = sorted(bad)
    assert wrong == {}


def test_the_cli_finds_every_component_command_through_entry_points():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][
        "paddlecloud.commands"]
    assert {target.split(".")[0] for target in declared.values()} == set(COMPONENTS)
    from paddlecloud.cli.main import component_commands
    assert set(component_commands()) == set(declared), "reinstall: pip install -e ."


def test_the_check_sees_imports_and_package_files(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import master.state\nfrom job_server import app\nfrom . import near\n"
                     "importlib.resources.files('pdj_operator') / 'x'\nimport json\n"
                     "from paddlecloud.backends import k8s\n")
    assert {room(name) for name in imported(probe)} == {
        "master", "job_server", "pdj_operator", "paddlecloud.backends.k8s", "core"}


# bench/ measures what users run: the master as a process (its CLI), the core (its client,
# `paddlecloud.master_client`), the trainer's library; never the master's internals, or
# a benchmark measures a copy of the code users run, not that code.


def source_module(name: str) -> str:
    """The module of an imported name (`master.state.JobState` -> `master.state`)."""
    parts = name.split(".")
    while len(parts) > 1 and not (ROOT.joinpath(*parts).with_suffix(".py").exists()
                                  or (ROOT.joinpath(*parts) / "__init__.py").exists()):
        parts.pop()
    return ".".join(parts)


def test_the_benchmarks_import_no_internals_of_the_master():
    found = {}
    for path in sorted((ROOT / "bench").glob("*.py")):
        reached = {source_module(name) for name in imported(path) if room(name) == "master"}
        if reached:
            found[str(path.relative_to(ROOT))] = sorted(reached)
    assert found == {}
    for bench in ("scale.py", "dispatch.py", "faults.py", "footprint.py"):  # their trainers are
        assert "paddlecloud.master_client" in imported(ROOT / "bench" / bench), bench  # users' client
