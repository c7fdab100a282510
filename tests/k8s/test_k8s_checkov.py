"""An independent scanner over everything paddlecloud renders: checkov's Kubernetes checks.

Runs checkov (PyPI) over `job submit --dry-run` of representative flag sets and the
PaddleJob examples, every file in deploy/, every kustomize overlay as `kubectl apply -k`
sends it (tests/k8s/test_kustomize.py), and the Kaniko build Job. Every failed check
must be in tests/k8s/checkov-skips.txt, which gives each skip its reason, and every
skip there must still be needed (a stale skip fails too).

checkov pins packages this project's venv has newer (packaging, python-dateutil), so it
lives in its own venv: `.venv-checkov` (made by `make test`) or the one $PADDLECLOUD_CHECKOV
names. Without either the test skips, except in CI (CI=true), where it fails.
"""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from rendered_objects import REPO, rendered
from test_kustomize import rendered_overlays

SKIPS = Path(__file__).with_name("checkov-skips.txt")


def _checkov() -> str:
    found = os.environ.get("PADDLECLOUD_CHECKOV") or str(REPO / ".venv-checkov" / "bin" / "checkov")
    if not Path(found).exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"checkov not found at {found}: `make test` installs it in .venv-checkov")
        pytest.skip(f"checkov not found at {found}: `make .venv-checkov/bin/checkov` (what `make test` "
                    "does) installs it, or PADDLECLOUD_CHECKOV=/path/to/checkov names one")
    return found


def read_skips() -> list[tuple[str, str, str]]:
    out = []
    for line in SKIPS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            check, pattern, reason = line.split(maxsplit=2)
            assert reason.strip(), line
            out.append((check, pattern, reason))
    return out


def test_checkov_finds_nothing_but_the_written_skips(tmp_path):
    checkov = _checkov()
    for i, (source, docs) in enumerate({**rendered(), **rendered_overlays()}.items()):
        docs = [d for d in docs if d.get("kind") != "CustomResourceDefinition"]
        (tmp_path / f"{i:02d}.yaml").write_text(f"# {source}\n" + yaml.safe_dump_all(docs, sort_keys=False))
    result = subprocess.run([checkov, "-d", str(tmp_path), "--framework", "kubernetes", "--quiet",
                             "--compact", "-o", "json"], capture_output=True, text=True, timeout=600)
    reports = json.loads(result.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    failed = [(f["check_id"], f["resource"]) for r in reports for f in r["results"]["failed_checks"]]
    assert sum(r["summary"]["resource_count"] for r in reports) > 100  # it read what we gave it
    skips = read_skips()
    used: set[tuple[str, str]] = set()
    left = []
    for check, resource in failed:
        match = next(((c, p) for c, p, _ in skips if c == check and fnmatch.fnmatch(resource, p)), None)
        if match is None:
            left.append(f"{check} {resource}")
        else:
            used.add(match)
    assert not left, "checkov failures without a written skip:\n" + "\n".join(sorted(set(left)))
    stale = [f"{c} {p}" for c, p, _ in skips if (c, p) not in used]
    assert not stale, f"skips no longer needed: remove them from {SKIPS.name}: {stale}"
