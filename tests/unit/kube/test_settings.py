"""Settings from the environment: names, types, errors, overrides."""

from __future__ import annotations

import pytest

from kube.settings import ClientSettings, LoggingSettings, QueueSettings, WatchSettings


def test_defaults_without_environment() -> None:
    assert ClientSettings.from_env(environ={}) == ClientSettings()
    assert ClientSettings().qps == 500 and ClientSettings().burst == 1000


def test_values_are_read_and_typed() -> None:
    env = {
        "GPUFERRY_CLIENT_QPS": "20.5",
        "GPUFERRY_CLIENT_BURST": "40",
        "GPUFERRY_CLIENT_USER_AGENT": "vk/1",
        "GPUFERRY_QUEUE_WORKERS": "4",
        "GPUFERRY_LOG_FORMAT": "json",
        "GPUFERRY_LOG_QUIET_LIBRARIES": "no",
        "OTHER_CLIENT_QPS": "1",
    }
    client = ClientSettings.from_env(environ=env)
    assert (client.qps, client.burst, client.user_agent) == (20.5, 40, "vk/1")
    assert QueueSettings.from_env(environ=env).workers == 4
    logging_settings = LoggingSettings.from_env(environ=env)
    assert logging_settings.format == "json" and logging_settings.quiet_libraries is False
    assert ClientSettings.from_env(prefix="OTHER_", environ=env).qps == 1


def test_keyword_overrides_win() -> None:
    env = {"GPUFERRY_WATCH_TIMEOUT_SECONDS": "60"}
    assert WatchSettings.from_env(environ=env).timeout_seconds == 60
    assert WatchSettings.from_env(environ=env, timeout_seconds=5).timeout_seconds == 5


def test_env_names_are_documented_by_field() -> None:
    names = WatchSettings.env_names()
    assert names["backoff_max"] == "GPUFERRY_WATCH_BACKOFF_MAX"


@pytest.mark.parametrize(
    ("cls", "env", "match"),
    [
        (ClientSettings, {"GPUFERRY_CLIENT_BURST": "lots"}, "GPUFERRY_CLIENT_BURST='lots': expected int"),
        (LoggingSettings, {"GPUFERRY_LOG_FORMAT": "xml"}, "expected one of text, json"),
        (LoggingSettings, {"GPUFERRY_LOG_QUIET_LIBRARIES": "maybe"}, "expected a boolean"),
    ],
)
def test_bad_values_name_the_variable(
    cls: type[ClientSettings | LoggingSettings], env: dict[str, str], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        cls.from_env(environ=env)


def test_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFERRY_QUEUE_BACKOFF_MAX", "7")
    assert QueueSettings.from_env().backoff_max == 7.0
