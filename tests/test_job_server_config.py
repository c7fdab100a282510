"""The job server's configuration: tokens to namespaces, unknown keys refused naming them."""

from __future__ import annotations

import pytest

from job_server.config import ConfigError, load_config

pytestmark = pytest.mark.unit


def test_a_full_config_loads_with_its_tokens(tmp_path):
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("tok-a: [team-a]\ntok-ops: [team-a, team-b]\n")
    config = tmp_path / "config.yaml"
    config.write_text(f"store: s3://bucket/pc\ntokens_file: {tokens}\npaddlejobs: true\n"
                      "limits: {max_files: 10}\nquotas: {max_gpus_per_job: 8}\n"
                      "build: {registry: reg.example.com/pc, namespace: builds}\n")
    loaded = load_config(str(config))
    assert loaded.tokens == {"tok-a": ("team-a",), "tok-ops": ("team-a", "team-b")}
    assert (loaded.store, loaded.paddlejobs, loaded.limits.max_files) == ("s3://bucket/pc", True, 10)
    assert loaded.quotas.max_gpus_per_job == 8 and loaded.build.namespace == "builds"


@pytest.mark.parametrize(("text", "says"), [
    ("stor: /x\n", "unknown config key stor"),
    ("limits: {max_file: 3}\n", "unknown config key limits.max_file"),
    ("paddlejobs: maybe\n", "config key paddlejobs"),
])
def test_a_bad_config_is_refused_naming_the_key(tmp_path, text, says):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=says):
        load_config(str(path))


def test_a_token_without_namespaces_is_refused(tmp_path):
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("tok-a: []\n")
    with pytest.raises(ConfigError, match="needs a list of namespaces"):
        load_config(None, tokens_file=str(tokens))
