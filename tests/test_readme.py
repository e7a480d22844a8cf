"""The README and docs/: the two commands first, a quick start that runs as written, the settings
table in step with the Settings class, and nothing referenced outside the repository."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from ingest.config import Settings

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
SETTINGS_DOC = REPO / "docs" / "settings.md"


def test_readme_opens_with_run_and_test_commands():
    opening = "\n".join(README.splitlines()[:8])
    assert "make run" in opening and "make test" in opening


def test_settings_doc_documents_every_setting_with_its_default():
    text = SETTINGS_DOC.read_text()
    for f in dataclasses.fields(Settings):
        row = f"| `--{f.name.replace('_', '-')}` | `FLEETLOG_{f.name.upper()}` | `{f.default}` | {f.metadata['help']} |"
        assert row in text, row


def test_quick_start_commands_run_from_the_repository_root_without_an_activated_venv():
    quick = README[README.index("## Quick start"):README.index("## Documentation")]
    commands = [line.split("#")[0].strip() for block in re.findall(r"```\n(.*?)```", quick, re.S)
                for line in block.splitlines()]
    commands = [c for c in commands if c]
    assert commands, "no command in the quick start"
    for command in commands:
        first = command.split()[0]
        assert first in ("make", "curl", ".venv/bin/fleetlog") or command.startswith('"'), command
    for step in ("make run", "fleetlog demo", "api/v1/logs", "fleetlog logs", "fleetlog query", "make test"):
        assert step in quick, step


def test_commands_the_quick_start_uses_exist():
    from ingest.cli import _parser

    commands = set(_parser()._subparsers._group_actions[0].choices)
    used = set(re.findall(r"\.venv/bin/fleetlog (\w+)", README))
    assert used and used <= commands, used - commands


def test_links_stay_inside_the_repository_and_resolve():
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = doc.read_text()
        assert "../shared" not in text and "/work/" not in text, doc
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
            if target.startswith(("http://", "https://")):
                continue
            assert (doc.parent / target).resolve().is_file(), f"{doc.name}: {target}"
            assert REPO in (doc.parent / target).resolve().parents, f"{doc.name}: {target} is outside the repository"


def test_readme_says_how_to_move_off_the_default_ports():
    for text in ("--port", "--otlp-grpc-port", "FLEETLOG_PORT", "FLEETLOG_OTLP_GRPC_PORT"):
        assert text in README, text


async def test_quick_start_push_lands_in_a_run_that_completes(client):
    """Step 4's bodies, posted as written: the line is in the run the agent's follow shows, and the
    stream it opens ends complete (not "1/1 incomplete" for good)."""
    import orjson

    quick = README[README.index("## Quick start"):README.index("## Documentation")]
    bodies = [(path, orjson.loads(body)) for path, body in re.findall(r"curl -s 127\.0\.0\.1:8080(/api/v1/\w+) -d '(.*?)'", quick, re.S)]
    assert any(path == "/api/v1/logs" for path, _ in bodies), bodies
    for path, body in bodies:
        r = await client.post(path, data=orjson.dumps(body))
        assert r.status == 200, await r.text()
    pushed = next(body for path, body in bodies if path == "/api/v1/logs")
    assert pushed.get("run_id") not in (None, "0"), pushed  # run "0" is what a push with no run_id lands in
    detail = await (await client.get(f"/api/v1/instances/{pushed['instance_id']}")).json()
    entry = detail["logs"][pushed["source"]]
    assert entry["run_id"] == pushed["run_id"] and entry["complete"] is True, detail["logs"]
