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


# ---- proofs completed ------------------------------------------------------------------------

from hypothesis import given, strategies as st  # noqa: E402

from agent.result import ProofCounter  # noqa: E402

DONE_FORMATS = [
    "proof {i}/{n} done in 141.0 s",  # benchmark.sh's stdout (tests/scripts/bench_ok.sh, standin_benchmark.sh)
    "INFO cuzk_daemon::prover: PoRep C2 proof {i}/{n} finished",  # the daemon's log
    "INFO cuzk_daemon::prover: PoRep C2 proof {i}/{n}: 10 partitions done in 141.0 s",  # ingest/demo.py
    "PoRep C2 proof {i}/{n} ...done",  # /work/shared/INCIDENT.md
    "Proof #{i}/{n} completed (141.0s)",
]
NOT_DONE_FORMATS = [
    "INFO cuzk_daemon::prover: PoRep C2 proof {i}/{n} started",
    "waiting for proof {i}/{n}...",
    "proof {i}/{n} failed",
    "ERROR proof {i}/{n} done with error: CUDA error: out of memory",
]
NOT_PROOF_FORMATS = [  # numbered, "done", but not a proof
    "fetching v28-stacked-proof-of-replication part {i}/{n} done",
    "partition {i}/{n} done in 14.0 s",
]


def test_proofs_counts_each_completed_proof_once_whatever_the_format():
    counter = ProofCounter()
    counter.feed(["proof 1/12 done in 141.0 s", "INFO cuzk_daemon::prover: PoRep C2 proof 1/12 finished",
                  "PoRep C2 proof 2/12 ...done", "proof 3/12 failed", "warm-up proof: done"])
    assert (counter.count, counter.total) == (2, 12)


def test_proofs_are_unknown_when_no_line_numbers_them():
    counter = ProofCounter()
    counter.feed(["Starting benchmark", "Throughput: 42.5 proofs/hour"])
    assert counter.count is None


@given(
    n=st.integers(1, 40),
    plan=st.lists(st.tuples(st.integers(1, 40), st.sampled_from(DONE_FORMATS + NOT_DONE_FORMATS + NOT_PROOF_FORMATS)), max_size=120),
    noise=st.lists(st.text(st.characters(blacklist_characters="\n\r"), max_size=40), max_size=10),
    cuts=st.lists(st.integers(0, 200), max_size=8),
)
def test_proofs_count_is_the_distinct_proofs_with_a_done_line_however_the_lines_are_read(n, plan, noise, cuts):
    lines = [fmt.format(i=min(i, n), n=n) for i, fmt in plan] + [x for x in noise if "proof" not in x.lower()]
    expected = {min(i, n) for i, fmt in plan if fmt in DONE_FORMATS}
    counter = ProofCounter()
    at = 0
    for cut in sorted(cuts) + [len(lines)]:  # fed in reads of any sizes
        counter.feed(lines[at:max(at, cut)])
        at = max(at, cut)
    again = ProofCounter.from_json(counter.to_json())  # and through state.json
    numbered = any(fmt not in NOT_PROOF_FORMATS for _i, fmt in plan)
    assert counter.count == again.count == (len(expected) if numbered else None)
    if numbered:
        assert counter.total == again.total == n
