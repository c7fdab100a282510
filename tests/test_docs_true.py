"""The docs stay true to the tree: docs/architecture.md names every module, code comments cite
docs/design.md by its path and by a section it has, and docs/benchmarks.md opens with today's
figures and has a section for every benchmark in bench/."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PACKAGES = ("paddlecloud", "master", "trainer_agent", "pserver_agent", "job_server", "autoscaler",
            "pdj_operator")
GENERATED = ("paddlecloud/master/v1",)  # the gRPC stubs: `protogen.py` and `api.py` stand for them
NOT_BENCHMARKS = {"common.py", "launch_fit_a_line.py"}  # shared helpers and recovery.py's script


def _modules() -> list[Path]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if path.name != "__init__.py" and not relative.startswith(GENERATED):
                found.append(path)
    return found


def _sources() -> list[Path]:
    return [*_modules(), *sorted((ROOT / "bench").glob("*.py")), *sorted((ROOT / "tests").rglob("*.py")),
            *sorted((ROOT / "examples").rglob("*.py"))]


def _comments_and_docstrings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of `path`: what the docs rules cover (strings
    the code uses, such as error messages, are code)."""
    text = path.read_text(encoding="utf-8")
    found = [(token.start[0], token.string) for token in tokenize.generate_tokens(io.StringIO(text).readline)
             if token.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant) \
                    and isinstance(node.body[0].value.value, str):
                found.append((node.body[0].lineno, node.body[0].value.value))
    return found


@pytest.mark.unit
def test_architecture_names_every_module_of_the_tree():
    page = (DOCS / "architecture.md").read_text(encoding="utf-8")
    unnamed = [path.relative_to(ROOT).as_posix() for path in _modules()
               if f"{path.stem}.py" not in page and f"`{path.stem}`" not in page]
    assert not unnamed, f"docs/architecture.md does not name these modules: {unnamed}"


def test_comments_cite_docs_design_md_by_its_path():
    stale = [f"{path.relative_to(ROOT)}:{line}" for path in _sources()
             for line, text in _comments_and_docstrings(path) if re.search(r"\bDESIGN(\.md| §| section)", text)]
    assert not stale, f"cite docs/design.md, not DESIGN.md: {stale}"


def test_every_cited_section_of_docs_design_md_exists():
    sections = set(re.findall(r"^## (\d+[a-z]?)\. ", (DOCS / "design.md").read_text(encoding="utf-8"), re.M))
    assert {"3", "8", "8a", "12"} <= sections
    cited = re.compile(r"docs/design\.md(?:,)? (?:section |§)(\d+[a-z]?)")
    wrong = [f"{path.relative_to(ROOT)}:{line} cites section {number}"
             for path in _sources() for line, text in _comments_and_docstrings(path)
             for number in cited.findall(" ".join(text.split())) if number not in sections]
    assert not wrong, f"docs/design.md has no such section: {wrong}"


@pytest.mark.unit
def test_benchmarks_page_opens_with_todays_figures_each_with_its_command_and_machine():
    page = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    first = re.search(r"^## (.+)$", page, re.M)
    assert first and first.group(1) == "Today's figures", first
    table = page[first.end():].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert rows[0] == "| what | figure | command | machine |", rows[0]
    for row in rows[2:]:
        cells = [cell.strip() for cell in row.strip("|").split(" | ")]
        assert len(cells) == 4 and all(cells), row
        scripts = re.findall(r"bench/(\w+\.py)", cells[2])
        assert scripts and all((ROOT / "bench" / script).is_file() for script in scripts), row


@pytest.mark.unit
def test_every_benchmark_in_bench_has_its_section():
    headings = re.findall(r"^## (.+)$", (DOCS / "benchmarks.md").read_text(encoding="utf-8"), re.M)
    missing = [path.name for path in sorted((ROOT / "bench").glob("*.py"))
               if path.name not in NOT_BENCHMARKS and not any(f"`bench/{path.name}`" in h for h in headings)]
    assert not missing, f"docs/benchmarks.md has no section for {missing}"
