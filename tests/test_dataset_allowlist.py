"""SetDataset's allow-list (`--allow-set-dataset`): prefixes compared on parsed URLs and resolved
paths, never on spelling. Each bypass found by the security probe of issue 34 is here; the
real master's end of it (an HTTP server that must see no request) is in test_master_bounds.py.
"""

from __future__ import annotations

import pytest

from master.config import MasterConfig, SpecError
from master.dataset_allowlist import AllowList, NotAllowed

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("prefixes, path, why", [
    (["/allowed"], "/allowedX/a.csv", "not under an allowed prefix"),
    (["/allowed/"], "/allowed_secret/a.csv", "not under an allowed prefix"),
    (["/allowed"], "/allowed/../etc/passwd", "holds '..'"),
    (["/allowed"], "allowed/a.csv", "not absolute"),
    (["/allowed"], "file:///etc/passwd", "not under an allowed prefix"),
    (["http://localhost"], "http://localhost@127.0.0.1:8080/x.csv", "user information"),
    (["http://localhost"], "http://localhost:8080/x.csv", "not under an allowed prefix"),
    (["http://h/data/"], "http://h/data/%2e%2e/etc/passwd", "holds '..'"),
    (["http://h/data/"], "http://h/data/%252e%252e/etc/passwd", "holds '..'"),
    (["http://h/data/"], "http://h/data/..%5c..%5cetc/passwd", "holds '..'"),
    (["http://h/data/"], "http://h/data%2f..%2fsecret", "holds '..'"),
    (["http://h/data"], "http://h/dataX/a.csv", "not under an allowed prefix"),
    (["http://h/data"], "https://h/data/a.csv", "not under an allowed prefix"),
    (["s3://bucket/"], "s3://bucketX/a.csv", "not under an allowed prefix"),
    (["http://127.0.0.1:1/"], "http://127.0.0.1:1/x.csv::memory://", "chained fsspec URL"),
])
def test_bypasses_are_refused_naming_the_path(prefixes, path, why):
    with pytest.raises(NotAllowed, match=why) as raised:
        AllowList(prefixes).check(path)
    assert path[:40].replace("\\", "\\\\") in str(raised.value)


@pytest.mark.parametrize("prefixes, path", [
    (["/allowed"], "/allowed/a.csv"),
    (["/allowed/"], "/allowed/sub/*.csv"),
    (["/allowed/"], "/allowed"),
    (["/allowed"], "file:///allowed/a.csv"),
    (["http://LocalHost"], "HTTP://localhost:80/x.csv"),
    (["http://h/data/"], "http://h/data/a%20b.csv?v=1"),
    (["s3://bucket/"], "s3://bucket/any/where/*.csv"),
    (["hdfs://"], "hdfs://namenode:8020/user/a.csv"),
])
def test_paths_under_a_prefix_are_allowed(prefixes, path):
    AllowList(prefixes).check(path)


def test_symlinks_are_resolved_on_both_sides(tmp_path):
    allowed, secret = tmp_path / "allowed", tmp_path / "secret"
    allowed.mkdir()
    secret.mkdir()
    (secret / "key.csv").write_text("k\n")
    (allowed / "to-secret").symlink_to(secret)
    (tmp_path / "link-to-allowed").symlink_to(allowed)
    allow = AllowList([f"{tmp_path}/link-to-allowed/"])  # a prefix that is a symlink itself
    allow.check(f"{allowed}/a.csv")
    with pytest.raises(NotAllowed, match="not under an allowed prefix"):
        allow.check(f"{allowed}/to-secret/key.csv")
    # a glob does not resolve: its listing is checked file by file
    allow.check(f"{allowed}/*/key.csv")
    with pytest.raises(NotAllowed, match="reaches .*to-secret/key.csv"):
        allow.check_listed(f"{allowed}/*/key.csv", [f"{allowed}/to-secret/key.csv"])


@pytest.mark.parametrize("prefix", ["http://user@host/", "data/", "/data/../etc"])
def test_a_bad_prefix_fails_the_masters_start(prefix):
    with pytest.raises(SpecError, match="--allow-set-dataset"):
        MasterConfig(job="j", namespace="local", etcd_endpoints="127.0.0.1:2379", set_dataset_prefixes=(prefix,))
