"""Settings: flags, then the environment, then defaults; a bad value names its origin."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent.config import ConfigError, env_names, load

DOCS = Path(__file__).resolve().parents[2] / "docs" / "agent.md"
BASE = ["--server", "http://127.0.0.1:8080", "--instance-id", "C.32733029"]


def test_vast_container_id_becomes_the_instance_id():
    inv = load(["run", "--", "./benchmark.sh", "12"], {"FLEETLOG_SERVER": "http://10.0.0.2:8080", "CONTAINER_ID": "32733029"})
    assert inv.settings.instance_id == "C.32733029"
    assert inv.argv == ("./benchmark.sh", "12")
    assert inv.settings.source == "benchout"


def test_flags_win_over_the_environment():
    inv = load(["run", *BASE, "--flush-timeout", "5", "--", "true"], {"FLEETLOG_AGENT_FLUSH_TIMEOUT_S": "99", "FLEETLOG_INSTANCE_ID": "C.1"})
    assert inv.settings.flush_timeout_s == 5.0
    assert inv.settings.instance_id == "C.32733029"


def test_tails_from_flags_and_from_the_environment():
    inv = load(["tail", *BASE, "--tail", "cuzk=/var/log/cuzk.log", "--tail", "curio=/var/log/curio.log"], {})
    assert inv.settings.tails == (("cuzk", "/var/log/cuzk.log"), ("curio", "/var/log/curio.log"))
    inv = load(["tail", *BASE], {"FLEETLOG_AGENT_TAIL": "cuzk=/a.log, curio=/b.log"})
    assert inv.settings.tails == (("cuzk", "/a.log"), ("curio", "/b.log"))


@pytest.mark.parametrize(
    "argv, env, message",
    [
        (["run", *BASE, "--flush-timeout", "soon", "--", "true"], {}, "--flush-timeout-s: expected float, got 'soon'"),
        (["run", *BASE, "--", "true"], {"FLEETLOG_AGENT_GRACE_S": "-1"}, "--grace-s: must be >= 0"),
        (["run", *BASE, "--", "true"], {"FLEETLOG_MACHINE_ID": "55891x"}, "FLEETLOG_MACHINE_ID: expected int"),
        (["run", *BASE, "--tail", "nopath", "--", "true"], {}, "--tail: expected SOURCE=PATH"),
        (["run", *BASE, "--rate-regex", "[0-9.]+ proofs", "--", "true"], {}, "--rate-regex: needs a capturing group"),
        (["run", *BASE], {}, "run: expected the command after '--'"),
        (["run", "--instance-id", "C.1", "--", "true"], {}, "--server: required"),
        (["tail", *BASE], {}, "tail: expected at least one --tail"),
        (["run", *BASE, "--spool-full-policy", "block", "--", "true"], {}, "--spool-full-policy: expected one of drop_oldest, drop_newest"),
        (["run", *BASE, "--", "true"], {"FLEETLOG_AGENT_SPOOL_FSYNC": "maybe"}, "FLEETLOG_AGENT_SPOOL_FSYNC: expected bool"),
        # the server's source rule: a name it would refuse on every push stops the agent at start-up
        (["tail", *BASE, "--tail", 'nvidia"smi=/var/log/smi.log'], {}, "--tail: must not contain"),
        (["tail", *BASE, "--tail", "c:\\logs\\=/var/log/x.log"], {}, "--tail: must not contain"),
        (["run", *BASE, "--source=-rf", "--", "true"], {}, "--source: must not start with '-'"),
        (["run", *BASE, "--source", "x" * 129, "--", "true"], {}, "--source: must be at most 128 characters"),
    ],
)
def test_a_bad_setting_stops_the_agent_naming_it(argv, env, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load(argv, env)


def test_event_fields_are_json_when_they_parse():
    inv = load(["event", *BASE, "params_done", "duration_s=212.5", "note=56 GiB fetched", 'labels={"gpu":"4090"}'], {})
    assert inv.event_kind == "params_done"
    assert inv.event_fields == {"duration_s": 212.5, "note": "56 GiB fetched", "labels": {"gpu": "4090"}}
    assert inv.settings.flush_timeout_s == 30.0


def test_docs_name_every_environment_variable():
    text = DOCS.read_text()
    missing = [env for env in env_names().values() if env not in text]
    assert not missing, f"docs/agent.md does not mention {missing}"
