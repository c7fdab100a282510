"""The committed gRPC code must be what `python -m paddlecloud.protogen` writes today."""

from __future__ import annotations

import pytest

from paddlecloud import protogen

pytestmark = pytest.mark.unit


def test_generated_code_is_up_to_date(tmp_path):
    protogen.generate(tmp_path)
    committed = protogen.REPO / "paddlecloud" / "master" / "v1"
    fresh = tmp_path / "paddlecloud" / "master" / "v1"
    stale = [name for name in protogen.GENERATED
             if (fresh / name).read_bytes() != (committed / name).read_bytes()]
    assert not stale, f"{stale} are stale: run `python -m paddlecloud.protogen` and commit"
