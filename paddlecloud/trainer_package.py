"""What a trainer package holds, read the same way at every door: its requirements and its entry point.

A package is a folder of files (`job submit --package-path`, the Python API's
`trainer_package`, an upload to the Job Server, `local train --package-path`). Every door
reads it with these functions, so the seeds' forms mean one thing everywhere:

* **Requirements.** `requirements.txt` at the package's root lists what its image build
  installs. Seed 001 spells it `requirments.txt`: a package holding only that spelling
  has it read as `requirements.txt` (a copy is added beside it, the user's file kept),
  with a warning saying so, so its dependencies are never dropped silently; a package
  holding both, differing, is refused naming both.
* **The entry point.** Without a module, the package's `train.py` (seed 002 runs
  `/train/package/train.py`) or `trainer.py` (seed 001's example) at its root is run as
  `python -m train` / `trainer`. A module is looked for in two forms: with the folder as
  the import root (`--package-path ./quick_start --module train`), or with the folder as
  the module's top package (seed 002's `--package-path=./demo --module=demo.train`, which
  means what `python -m demo.train` means beside the folder: the folder is importable under
  its own name).

What this does NOT do: import anything. A module is found by its file (`a/b.py`,
`a/b/__init__.py` or `a/b/__main__.py`); whether it runs, only running it tells.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from paddlecloud.jobfields import JobSpecError

logger = logging.getLogger(__name__)

REQUIREMENTS = "requirements.txt"
SEED_SPELLING = "requirments.txt"  # seed 001's "You need to provide requirments.txt"
ENTRY_SCRIPTS = ("train.py", "trainer.py")  # seed 002's train.py; seed 001's trainer.py
SKIPPED_PARTS = ("__pycache__",)  # besides hidden files and folders, and .pyc files
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def package_paths(folder: Path) -> list[str]:
    """The files of a package folder, relative and '/'-separated, as every door ships them:
    hidden files and folders, caches and .pyc files left out."""
    out = []
    for file in sorted(folder.rglob("*")):
        rel = file.relative_to(folder)
        if any(part.startswith(".") or part in SKIPPED_PARTS for part in rel.parts):
            continue
        if file.is_file() and file.suffix != ".pyc":
            out.append(rel.as_posix())
    return out


def with_requirements(files: Mapping[str, bytes], *, where: str,
                      warn: Callable[[str], None] = logger.warning) -> dict[str, bytes]:
    """The package's files with its requirements as `requirements.txt`: seed 001's
    `requirments.txt` alone is copied to that name (and `warn` says so); both, differing,
    raise `JobSpecError` naming them."""
    out = dict(files)
    if SEED_SPELLING not in out:
        return out
    if REQUIREMENTS in out:
        if out[REQUIREMENTS] != out[SEED_SPELLING]:
            raise JobSpecError(
                f"{where} holds both {REQUIREMENTS} and {SEED_SPELLING}, which differ: keep one "
                f"({REQUIREMENTS} is the one an image build installs)")
        return out
    out[REQUIREMENTS] = out[SEED_SPELLING]
    listed = requirements_listed(out)
    warn(f"{where}: {SEED_SPELLING} (seed 001's spelling) is read as {REQUIREMENTS}"
         + (f" ({', '.join(listed[:3])}{', ...' if len(listed) > 3 else ''})" if listed else "")
         + f"; rename it {REQUIREMENTS} to silence this warning")
    return out


def requirements_listed(files: Mapping[str, bytes]) -> list[str]:
    """The requirements `requirements.txt` lists (comments and blank lines left out)."""
    text = files.get(REQUIREMENTS, b"").decode("utf-8", errors="replace")
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.strip().startswith("#")]


@dataclass(frozen=True)
class EntryPoint:
    """The module trainers run, and where the package's folder must be for it to import:
    `top_package` means under its own name (`folder`) in a directory on the path, rather than
    on the path itself."""

    module: str
    folder: str
    top_package: bool = False

    def placed(self, files: Mapping[str, bytes]) -> dict[str, bytes]:
        """The package's files as they are laid out where the pods import them: under the
        folder's name for a top package, else as they are."""
        if not self.top_package:
            return dict(files)
        return {f"{self.folder}/{path}": content for path, content in files.items()}


def _found(module: str, paths: Collection[str]) -> bool:
    base = module.replace(".", "/")
    return any(p in paths for p in (f"{base}.py", f"{base}/__init__.py", f"{base}/__main__.py"))


def entry_point(module: str, paths: Collection[str], *, folder: str,
                where: str = "the package") -> EntryPoint:
    """The entry point of a package whose files are `paths` (relative, '/'-separated) and
    whose folder is named `folder`: `module` in either form (the module doc), or, without
    one, its train.py or trainer.py. Raises `JobSpecError` naming what was looked for."""
    if not module:
        script = next((s for s in ENTRY_SCRIPTS if s in paths), None)
        if script is None:
            raise JobSpecError(
                f"{where} has no entry point: it holds neither {' nor '.join(ENTRY_SCRIPTS)} at its "
                "root; name the module to run (--module, or module=)")
        return EntryPoint(module=script.removesuffix(".py"), folder=folder)
    if not _MODULE.fullmatch(module):
        raise JobSpecError(f"invalid module {module[:80]!r}: a dotted Python name such as "
                           "quick_start.train")
    if _found(module, paths):
        return EntryPoint(module=module, folder=folder)
    top, _, rest = module.partition(".")
    if rest and top == folder and _found(rest, paths):
        return EntryPoint(module=module, folder=folder, top_package=True)
    base = module.replace(".", "/")
    other = (f", nor {rest.replace('.', '/')}.py with {folder} as its top package"
             if rest and top == folder else "")
    raise JobSpecError(
        f"module {module!r} is not in {where}: it holds no {base}.py (or {base}/__init__.py){other}; "
        f"give the module relative to the package's folder (e.g. --module "
        f"{ENTRY_SCRIPTS[0].removesuffix('.py')}), or the folder's own name first "
        f"({folder}.MODULE)")
