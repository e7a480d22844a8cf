"""Settings: flags over environment over fleetlog.toml over defaults; bad values stop start-up by name."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ingest import config
from ingest.errors import ConfigError


def test_defaults_match_the_design(tmp_path):
    s = config.load({}, environ={}, cwd=tmp_path)
    assert (s.host, s.port, s.db) == ("127.0.0.1", 8080, "./var/fleetlog.duckdb")
    assert s.max_body_bytes == 16 * 1024 * 1024 and s.max_line_bytes == 256 * 1024


def test_flag_beats_env_beats_toml(tmp_path):
    (tmp_path / "fleetlog.toml").write_text(
        '[serve]\nport = 9000\nhost = "0.0.0.0"\nbatch-max-delay-s = 0.01\nallow-open-bind = true\n'
    )
    env = {"FLEETLOG_PORT": "9100", "FLEETLOG_QUERY_MAX_ROWS": "50"}
    s = config.load({"port": "9200"}, environ=env, cwd=tmp_path)
    assert (s.port, s.host, s.batch_max_delay_s, s.query_max_rows) == (9200, "0.0.0.0", 0.01, 50)
    s = config.load({}, environ=env, cwd=tmp_path)
    assert s.port == 9100


@pytest.mark.parametrize(
    "args, env, toml, named",
    [
        ({"port": "eighty"}, {}, None, "--port"),
        ({}, {"FLEETLOG_MAX_BODY_BYTES": "16MB"}, None, "FLEETLOG_MAX_BODY_BYTES"),
        ({}, {"FLEETLOG_PORT": "-1"}, None, "port"),
        ({}, {}, "[serve]\nport = 'x'\n", "[serve] port"),
        ({}, {}, "[serve]\nnot_a_setting = 1\n", "not_a_setting"),
        ({}, {}, "[serve\n", "cannot read configuration"),
        ({}, {"FLEETLOG_LOG_LEVEL": "LOUD"}, None, "log_level"),
        ({}, {"FLEETLOG_BATCH_MAX_DELAY_S": "nan-ish"}, None, "FLEETLOG_BATCH_MAX_DELAY_S"),
    ],
)
def test_bad_value_names_the_setting(tmp_path, args, env, toml, named):
    if toml is not None:
        (tmp_path / "fleetlog.toml").write_text(toml)
    with pytest.raises(ConfigError) as e:
        config.load(args, environ=env, cwd=tmp_path)
    assert named in str(e.value)


def test_serve_refuses_to_start_on_bad_env_value(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "ingest.cli", "serve", "--db", str(tmp_path / "x.duckdb")],
        env={"FLEETLOG_PORT": "http", "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "FLEETLOG_PORT" in proc.stderr
    assert not (tmp_path / "x.duckdb").exists()


def test_settings_are_frozen():
    s = config.Settings()
    with pytest.raises(AttributeError):
        s.port = 1  # type: ignore[misc]


def test_non_loopback_bind_without_tokens_is_refused_unless_allowed(tmp_path):
    with pytest.raises(ConfigError, match="host: 0.0.0.0 is not loopback"):
        config.load({"host": "0.0.0.0"}, environ={}, cwd=tmp_path)
    assert config.load({"host": "0.0.0.0", "allow_open_bind": "true"}, environ={}, cwd=tmp_path).host == "0.0.0.0"
    with_tokens = {"FLEETLOG_ENROLL_TOKEN": "e", "FLEETLOG_READ_TOKEN": "r", "FLEETLOG_ADMIN_TOKEN": "a"}
    assert config.load({"host": "0.0.0.0"}, environ=with_tokens, cwd=tmp_path).tokens_enabled
