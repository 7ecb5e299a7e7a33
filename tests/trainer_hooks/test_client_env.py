"""`MonitorClient.from_env`: configured from LLDMON_* like the trackers people know."""

from __future__ import annotations

from trainer_hooks.client import MonitorClient


def test_from_env_reads_the_environment_and_arguments_win() -> None:
    env = {
        "LLDMON_URL": "http://lldmon:8000",
        "LLDMON_TOKEN": "lldm_secret",
        "LLDMON_PROJECT": "nq",
        "LLDMON_RUN": "grpo-3b",
    }
    client = MonitorClient.from_env(environ=env, enabled=False)
    assert client.url == "http://lldmon:8000"
    assert client.identity.run_name == "grpo-3b" and client.identity.project == "nq"
    assert client._token == "lldm_secret"
    other = MonitorClient.from_env("mine", project="hotpot", environ=env, enabled=False, token="t2")
    assert other.identity.run_name == "mine" and other.identity.project == "hotpot"
    assert other._token == "t2"


def test_from_env_defaults() -> None:
    client = MonitorClient.from_env(environ={}, enabled=False, config={"lr": 1e-6})
    assert client.url == "http://127.0.0.1:8000"
    assert client.identity.run_name.startswith("run-")
    assert client.identity.project is None and client._token is None
    assert client.identity.config == {"lr": 1e-6}
