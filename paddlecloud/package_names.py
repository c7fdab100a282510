"""A trainer package may not shadow paddlecloud's own modules.

A package's files come first on the pods' PYTHONPATH (its ConfigMap, or the image the
Job Server builds), so a package with a top-level `master/` or `paddlecloud.py` would
replace the real module in every process started there, the agents beside the user's
code included (issue 34, finding 2). `check_package_names` refuses such a package,
naming the entry; `job submit --package-path` and the Job Server's upload both call it.

What this does NOT guarantee: anything about modules the package imports from
elsewhere, or about third-party modules it may shadow (that only hurts the job itself).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from paddlecloud.jobspec import JobSpecError

logger = logging.getLogger(__name__)

# paddlecloud's top-level packages: pyproject.toml's [tool.setuptools.packages.find] include
RESERVED_MODULES = frozenset({"paddlecloud", "master", "trainer_agent", "pserver_agent",
                              "autoscaler", "pdj_operator", "job_server"})


def top_level_module(path: str) -> str:
    """The module name the first component of `path` defines on sys.path: a folder's name,
    or a file's up to its first dot (`master.py`, `master.cpython-311-x86_64-linux-gnu.so`)."""
    first, _, rest = path.partition("/")
    return first if rest else first.split(".", 1)[0]


def check_package_names(paths: Iterable[str]) -> None:
    """Raises `JobSpecError` naming the first entry whose top-level module is paddlecloud's."""
    for path in sorted(paths):
        if top_level_module(path) in RESERVED_MODULES:
            raise JobSpecError(
                f"package entry {path[:80]!r} would shadow paddlecloud's module "
                f"{top_level_module(path)!r} (its files come first on the pods' PYTHONPATH): "
                "rename it, or move it inside a folder of your own")
