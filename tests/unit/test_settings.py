"""How a service reads its settings: defaults < YAML file < HOSS_* env < flags, lists comma-separated in env and
flags, and a bad value stops start-up naming the setting, the value and where it came from."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hoss.settings import SettingsError, load_settings
from rescheduler.settings import ReschedulerSettings
from resolver.settings import ResolverSettings
from workers.settings import WorkerSettings

REQUIRED = ["--tls-cert-file=c", "--tls-key-file=k"]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in [v for v in os.environ if v.upper().startswith("HOSS_")]:
        monkeypatch.delenv(variable)


def resolver(argv: list[str]) -> ResolverSettings:
    return load_settings(ResolverSettings, argv, prog="hoss-resolver", description="")


def test_a_flag_beats_env_which_beats_the_file_which_beats_the_default(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "resolver.yaml"
    config.write_text("port: 9001\nverify_after_seconds: 3\nlease_name: from-file\n")
    monkeypatch.setenv("HOSS_VERIFY_AFTER_SECONDS", "4")
    monkeypatch.setenv("HOSS_LEASE_NAME", "from-env")
    settings = resolver([*REQUIRED, "--config", str(config), "--lease-name=from-flag"])
    assert settings.port == 9001
    assert settings.verify_after_seconds == 4.0
    assert settings.lease_name == "from-flag"
    assert settings.write_timeout_seconds == 60.0


def test_the_file_may_be_named_by_hoss_config_and_spell_names_with_dashes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "resolver.yaml"
    config.write_text("tls-cert-file: c\ntls_key_file: k\nclient-names: [kube-apiserver]\nclient_ca_file: ca\n")
    monkeypatch.setenv("HOSS_CONFIG", str(config))
    settings = resolver([])
    assert (settings.tls_cert_file, settings.tls_key_file) == ("c", "k")
    assert settings.client_names == ["kube-apiserver"]


def test_lists_are_comma_separated_in_env_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOSS_HOSS_USERNAMES", "alice, bob,,carol")
    settings = resolver([*REQUIRED, "--host=127.0.0.2,127.0.0.3", "--client-names="])
    assert settings.hoss_usernames == ["alice", "bob", "carol"]
    assert settings.host == ["127.0.0.2", "127.0.0.3"]
    assert settings.client_names == []


def test_a_bad_value_names_the_setting_the_value_and_its_source(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "worker.yaml"
    config.write_text("candidates: lots\n")
    monkeypatch.setenv("HOSS_READ_BATCH", "0")
    with pytest.raises(SettingsError) as caught:
        load_settings(WorkerSettings, ["--config", str(config), "--log-format=xml"], prog="hoss-worker",
                      description="")
    message = str(caught.value)
    assert message.startswith("hoss-worker: invalid settings: ")
    assert f"candidates 'lots' (from file {config})" in message
    assert "read_batch '0' (from env HOSS_READ_BATCH)" in message
    assert "log_format 'xml' (from flag --log-format): Input should be 'text' or 'json'" in message


def test_a_setting_the_service_does_not_have_is_refused_in_the_file_and_ignored_in_env(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # deploy/ hands every container the same HOSS_* ConfigMap: each service takes the names it knows.
    monkeypatch.setenv("HOSS_ENFORCE", "hoss-only")
    settings = load_settings(WorkerSettings, ["--id=w"], prog="hoss-worker", description="")
    assert settings.id == "w"
    config = tmp_path / "worker.yaml"
    config.write_text("enforce: hoss-only\n")
    with pytest.raises(SettingsError, match=r"enforce 'hoss-only' \(from file .*\): Extra inputs are not permitted"):
        load_settings(WorkerSettings, ["--config", str(config)], prog="hoss-worker", description="")


@pytest.mark.parametrize(("text", "problem"), [(None, "No such file or directory"), ("- a\n", "must hold a mapping"),
                                               ("a: [\n", "cannot read settings file")])
def test_a_settings_file_that_cannot_be_read_stops_start_up(tmp_path: Path, text: str | None, problem: str) -> None:
    config = tmp_path / "resolver.yaml"
    if text is not None:
        config.write_text(text)
    with pytest.raises(SettingsError, match=problem):
        resolver([*REQUIRED, "--config", str(config)])


def test_flags_take_their_value_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = load_settings(ReschedulerSettings, ["--dry-run=true", "--node-selector=gpu=a100,zone=b",
                                                   "--kubeconfig=null"], prog="hoss-rescheduler", description="")
    assert settings.dry_run is True
    assert settings.node_labels == {"gpu": "a100", "zone": "b"}
    assert settings.kubeconfig == "null", "a file named null, not unset"


def test_a_model_built_in_code_reads_nothing_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOSS_MAX_MOVES", "7")
    assert ReschedulerSettings().max_moves == 4
    assert load_settings(ReschedulerSettings, [], prog="hoss-rescheduler", description="").max_moves == 7


def test_help_names_each_flag_its_env_and_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        load_settings(WorkerSettings, ["--help"], prog="hoss-worker", description="")
    text = " ".join(capsys.readouterr().out.split())
    assert "--log-format VALUE" in text
    assert "(env HOSS_LOG_FORMAT; default text)" in text
    assert "(env HOSS_POLICIES; default default)" in text
    assert "(env HOSS_ID; default hostname-pid)" in text
