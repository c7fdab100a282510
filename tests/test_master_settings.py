"""The master's settings are declared once (`paddlecloud.master_settings`): each is an option of
`paddlecloud master`, lands in the MasterConfig the master runs with, and survives the trip
the backends make it take: `master_flags` -> the command line's parse -> the config."""

from __future__ import annotations

import functools
import re

import pytest
from click.testing import CliRunner

from master.cli import master_command
from master.config import MasterConfig, Policy, SpecError
from paddlecloud.jobspec import JobSpec
from paddlecloud.master_flags import master_flags
from paddlecloud.master_settings import SECTIONS, SETTING, SETTINGS, default_of

pytestmark = pytest.mark.unit

# Settings read at start into another value, with where that value is.
READ_INTO = {"resume_from": "start_epoch", "etcd_password_file": "etcd_credentials.password"}


@pytest.fixture(autouse=True)
def no_settings_from_the_environment(monkeypatch):
    for setting in SETTINGS:
        if setting.envvar:
            monkeypatch.delenv(setting.envvar, raising=False)
    monkeypatch.delenv("PADDLE_ETCD_PASSWORD", raising=False)


def parsed_config(flags: list[str]) -> MasterConfig:
    """The MasterConfig `paddlecloud master FLAGS` would serve with."""
    values = dict(master_command.make_context("master", list(flags)).params)
    values.pop("log_level")
    return MasterConfig.from_settings(values)


def landed(config: MasterConfig, name: str) -> object:
    """Where setting `name`'s value is in `config`."""
    path = SETTING[name].field or READ_INTO[name]
    return functools.reduce(getattr, path.split("."), config)


def file_at(path, text: str = "x") -> str:
    path.write_text(text)
    return str(path)


def samples(tmp_path) -> dict[str, object]:
    """A value for every setting but those of round two, none of them the default."""
    return {
        "job": "j-1", "namespace": "team", "port": 9001, "host": "127.0.0.2",
        "advertise": "10.0.0.1:9001", "failover_hold": 3.5, "max_calls_in_flight": 7,
        "register_rate": 2.5, "register_burst": 30, "task_streams": False, "metrics_port": 9100,
        "etcd_endpoints": "http://127.0.0.1:2379,http://127.0.0.2:2379", "etcd_timeout": 4.0,
        "election_ttl": 6.0, "etcd_ca_file": "/etcd/ca.pem", "etcd_cert_file": "/etcd/c.pem",
        "etcd_key_file": "/etcd/k.pem", "etcd_user": "u",
        "etcd_password_file": file_at(tmp_path / "password", "pw\n"),
        "tokens_dir": str(tmp_path / "tokens"), "scaler_token_file": str(tmp_path / "scaler"),
        "tls_cert": file_at(tmp_path / "tls.crt"), "tls_key": file_at(tmp_path / "tls.key"),
        "tls_client_ca": file_at(tmp_path / "ca.crt"), "insecure": True,
        "set_dataset_prefixes": ("s3://bucket/", "/data/"),
        "inputs": ("/data/a*.csv", "s3://bucket/b"), "data_format": "file", "chunk_bytes": 4096,
        "chunks_per_task": 3, "epochs": 4, "shuffle_seed": 11, "start_epoch": 2,
        "session_ttl": 45.0, "task_timeout": 90.0, "max_task_failures": 5, "max_tasks_per_trainer": 4,
        "work_stealing": False,
        "deployer": "local", "trainers": 3, "min_trainers": 2, "max_trainers": 5,
    }


def test_every_setting_is_an_option_of_paddlecloud_master():
    options = {p.name: p for p in master_command.params}
    assert set(options) == {*SETTING, "log_level"}
    for setting in SETTINGS:
        option = options[setting.name]
        assert setting.flag.split("/")[0] in option.opts, setting.name
        assert (option.help, option.envvar, option.multiple) == (setting.help, setting.envvar, setting.multiple)


def test_every_setting_round_trips_from_master_flags_to_the_config(tmp_path):
    values = samples(tmp_path)
    config = parsed_config(master_flags(**values))
    expected = {**values, "etcd_password_file": "pw"}  # the file's text, not its name
    for name, value in expected.items():
        assert value != default_of(name), f"{name}: a sample equal to the default proves nothing"
        assert landed(config, name) == value, name

    # round two: the job spec's trainer range wins over the flags; the checkpoint moves the start
    from trainer_agent.checkpoint import TrainStatus, save_checkpoint

    spec = JobSpec(name="j-1", namespace="team", module="m.train", trainers=4, min_trainers=1,
                   max_trainers=6, etcd_endpoints=values["etcd_endpoints"]).validate()
    save_checkpoint(str(tmp_path / "ckpt"), {"w": 1}, TrainStatus(4))
    second = {**values, "deployer": "kubernetes", "job_spec": file_at(tmp_path / "job.yaml", spec.to_yaml()),
              "resume_from": str(tmp_path / "ckpt"), "start_epoch": None}
    config = parsed_config(master_flags(**second))
    assert (config.deployer, config.job_spec) == ("kubernetes", second["job_spec"])
    assert (config.trainers, config.min_trainers, config.max_trainers) == (4, 1, 6)
    assert landed(config, "resume_from") == 5  # TrainStatus(4).next()
    assert set(expected) | {"job_spec", "resume_from"} == set(SETTING), "a setting no round covers"


def test_a_master_built_in_code_has_the_command_lines_defaults():
    assert parsed_config(["--job", "j", "--etcd-endpoints", "127.0.0.1:2379"]) == MasterConfig(
        job="j", namespace=default_of("namespace"), etcd_endpoints="127.0.0.1:2379")


@pytest.mark.parametrize("build, flags, message", [
    (lambda: Policy(session_ttl=1), ["--session-ttl", "1s"], "--session-ttl 1s is too short"),
    (lambda: MasterConfig(job="j", namespace="n", etcd_endpoints="e:1", election_ttl=1.5),
     ["--election-ttl", "1.5"], "--election-ttl 1.5s is too short"),
    (lambda: MasterConfig(job="", namespace="n", etcd_endpoints="e:1"), ["--job", ""], "--job is empty"),
    (lambda: MasterConfig(job="j", namespace="n", etcd_endpoints="e:1", set_dataset_prefixes=("",)),
     ["--allow-set-dataset", ""], "--allow-set-dataset '' would allow every path"),
])
def test_a_config_built_in_code_is_held_to_the_flags_rules(build, flags, message):
    with pytest.raises(SpecError, match=re.escape(message)):
        build()
    result = CliRunner().invoke(master_command, ["--job", "j", "--etcd-endpoints", "e:1", *flags])
    assert result.exit_code == 2 and message in result.output, result.output


@pytest.mark.parametrize("build, flag", [
    (lambda: Policy(max_tasks_per_trainer=0), "--max-tasks-per-trainer"),
    (lambda: Policy(task_timeout=-1), "--task-timeout"),
    (lambda: MasterConfig(job="j", namespace="n", etcd_endpoints="e:1", deployer="cloud"), "--deployer"),
    (lambda: MasterConfig(job="j", namespace="n", etcd_endpoints="e:1", port=70000), "--port"),
    (lambda: MasterConfig(job="j", namespace="n", etcd_endpoints="e:1", register_rate=0), "--register-rate"),
    (lambda: MasterConfig(job="j", namespace="n", etcd_endpoints="bad://x"), "invalid etcd endpoint 'bad://x'"),
])
def test_the_flags_types_bound_a_config_built_in_code(build, flag):
    with pytest.raises(ValueError, match=re.escape(flag)):
        build()


def test_master_flags_refuses_a_setting_it_does_not_know():
    with pytest.raises(TypeError, match="shufle_seed"):
        master_flags(job="j", shufle_seed=3)


def test_the_dataset_settings_go_with_an_input_only():
    assert "--epochs" not in master_flags(job="j", epochs=3, data_format="file", shuffle_seed=2)
    flags = master_flags(job="j", inputs=("/d",), epochs=3, shuffle_seed=2)
    assert flags[flags.index("--epochs") + 1] == "3" and flags[flags.index("--shuffle-seed") + 1] == "2"


def test_master_help_lists_each_setting_under_its_section():
    output = CliRunner().invoke(master_command, ["--help"], terminal_width=200).output
    listed: dict[str, list[str]] = {}
    heading = None
    for line in output.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            heading = line[:-1]
        elif heading and (flag := re.match(r"  (?:-\w, )?(--[\w-]+)", line)):
            listed.setdefault(heading, []).append(flag.group(1))
    expected = {section.value: [s.flag.split("/")[0] for s in settings] for section, settings in SECTIONS.items()}
    assert listed == {**expected, "Options": ["--log-level", "--help"]}
