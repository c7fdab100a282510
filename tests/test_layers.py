"""The house's arrows run down: the CLI -> the components -> the `paddlecloud` core.

A component (the master, the agents, the job server, the autoscaler, the operator) imports
the core and nothing of another component, nor reads another's package files; the core
imports no component, except its CLI (`paddlecloud/cli.py`), which starts them. A shared
piece belongs in the core.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = "paddlecloud"
COMPONENTS = ("master", "trainer_agent", "pserver_agent", "job_server", "autoscaler", "pdj_operator")
CLI = ROOT / CORE / "cli.py"


def reached(path: Path) -> set[str]:
    """Top-level packages of the house that `path` imports or reads package files of."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "files" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.add(node.args[0].value.split(".")[0])  # importlib.resources.files("pkg")
    return found & {CORE, *COMPONENTS}


def sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("component", COMPONENTS)
def test_a_component_reaches_only_itself_and_the_core(component):
    wrong = {str(path.relative_to(ROOT)): sorted(reached(path) - {component, CORE})
             for path in sources(component)}
    assert {path: packages for path, packages in wrong.items() if packages} == {}


def test_the_core_reaches_no_component_but_through_its_cli():
    wrong = {str(path.relative_to(ROOT)): sorted(reached(path) - {CORE})
             for path in sources(CORE) if path != CLI}
    assert {path: packages for path, packages in wrong.items() if packages} == {}


def test_the_check_sees_imports_and_package_files(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import master.state\nfrom job_server import app\nfrom . import near\n"
                     "importlib.resources.files('pdj_operator') / 'x'\nimport json\n")
    assert reached(probe) == {"master", "job_server", "pdj_operator"}
