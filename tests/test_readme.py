"""The README's settings table stays in step with the Settings class."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ingest.config import Settings

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_readme_opens_with_run_and_test_commands():
    opening = "\n".join(README.splitlines()[:8])
    assert "make run" in opening and "make test" in opening


def test_readme_documents_every_setting_with_its_default():
    for f in dataclasses.fields(Settings):
        row = f"| `--{f.name.replace('_', '-')}` | `FLEETLOG_{f.name.upper()}` | `{f.default}` | {f.metadata['help']} |"
        assert row in README, row
