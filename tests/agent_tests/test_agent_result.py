"""The benchmark's rate and the failure excerpt."""

from __future__ import annotations

import pytest

from agent.result import Evidence, RateParser, compile_rate_regex


def rate_of(lines, regex=None):
    parser = RateParser(regex) if regex else RateParser()
    parser.feed(lines)
    return parser.rate


def test_rate_matches_proofs_per_hour_and_per_hr_and_the_last_match_wins():
    assert rate_of(["Throughput: 42.5 proofs/hour"]) == 42.5
    assert rate_of(["rate 31 proofs/hr"]) == 31.0
    assert rate_of(["warm-up: 12.0 proofs/hour (estimate)", "Benchmark result: 38.25 proofs/hour"]) == 38.25


def test_rate_is_none_not_zero_when_nothing_matches():
    assert rate_of(["benchmark.sh exited with error"]) is None


def test_rate_regex_override_uses_its_rate_group():
    assert rate_of(["RESULT rate=17.5/h"], r"rate=(?P<rate>[0-9.]+)/h") == 17.5


def test_rate_regex_without_a_group_is_refused():
    with pytest.raises(ValueError, match="capturing group"):
        compile_rate_regex(r"\d+ proofs/hour")


def test_excerpt_puts_the_daemons_error_first_then_the_last_lines():
    evidence = Evidence(last_lines=3)
    evidence.track("benchdaemon")
    evidence.track("stdout", show_last_lines=False)
    evidence.track("stderr")
    evidence.feed("benchdaemon", [
        "INFO cuzk_daemon::pce: extracting PCE (warm-up proof)",
        "ERROR cuzk_daemon::pce: CUDA error: out of memory (cudaErrorMemoryAllocation) during PCE extraction",
        "INFO cuzk_daemon: shutting down",
    ])
    evidence.feed("stdout", ["waiting for warm-up proof...", "proof 1/12 failed"])
    evidence.feed("stderr", ["benchmark.sh exited with error"])
    text = evidence.excerpt()
    errors, rest = text.split("== last lines of benchdaemon ==")
    assert "[benchdaemon] ERROR cuzk_daemon::pce: CUDA error: out of memory" in errors
    assert "[stdout] proof 1/12 failed" in errors
    assert "[stderr] benchmark.sh exited with error" in errors
    assert "INFO cuzk_daemon: shutting down" in rest and "== last lines of stderr ==" in rest
    assert "waiting for warm-up proof" not in text


def test_excerpt_is_bounded():
    evidence = Evidence()
    evidence.feed("benchdaemon", ["E" * 10_000 + " error"] * 50)
    assert len(evidence.excerpt(max_chars=8000)) <= 8000
