"""What a finished benchmark says: its rate, the proofs it completed, and the evidence of why it failed.

The rate is the last match of the rate pattern in the command's output (stdout and stderr); no
match means no rate (``None``), never 0: "the wrapper parsed nothing" and "the machine proved
nothing" are different facts, and confusing them is how the incident's ``0 proofs/hour`` came about.

The failure excerpt keeps the last lines of every tailed log (the daemon's) and of stderr, and puts
the error-looking lines of all of them (stdout too) first, because the first question is "what
went wrong" and the daemon's last words are usually the answer.

The proofs completed (``ProofCounter``) are the distinct proof numbers of the lines that say a
numbered proof finished, in any of the run's streams (the benchmark's stdout and the daemon's log
both say so of the same proof): ``proof 3/12 done in 141.0 s``, ``PoRep C2 proof 3/12 finished``,
``PoRep C2 proof 3/12: 10 partitions done in 141.0 s``, ``PoRep C2 proof 3/12 ...done``,
``Proof #3/12 completed``. A line about proof ``i/n`` counts when the rest of it says done, finished,
completed, succeeded or ok, and nothing of fail, error or abort; the warm-up proof has no number and
never counts. No numbered proof line at all means no count (``None``), never 0.

All three are part of the agent's persisted state (``Findings``, in state.json): they are fed the lines
of each spool record as it is written, and replayed from the records written after state.json, so
that a restarted agent, which reads on from the saved file positions, holds exactly what an agent
that was never killed would (issue 21.1: a rate line read before a SIGKILL was forgotten).
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any

DEFAULT_RATE_REGEX = r"(?i)(\d+(?:\.\d+)?)\s*proofs?\s*/\s*h(?:ou)?r\b"

ERROR_RE = re.compile(
    r"(?i)\b(?:error|errors|fatal|panic(?:ked)?|fail(?:ed|ure|s)?|exception|traceback|segfault|"
    r"segmentation fault|abort(?:ed)?|killed|out of memory|oom|timed? ?out|timeout|cannot|unable to)\b"
    r"|cuda\w*error\w*"
)
EXCERPT_ERROR_LINES = 20
EXCERPT_LAST_LINES = 15
EXCERPT_MAX_CHARS = 8000
EXCERPT_MAX_LINE_CHARS = 400
RATE_LINE_MAX_CHARS = 500  # what bench_done's rate_line carries


def compile_rate_regex(pattern: str) -> re.Pattern[str]:
    """The pattern must capture the number: a group named ``rate``, or its first group."""
    regex = re.compile(pattern)
    if regex.groups < 1:
        raise ValueError("needs a capturing group around the number, e.g. '([0-9.]+) proofs/hour'")
    return regex


class RateParser:
    def __init__(self, regex: re.Pattern[str] | str = DEFAULT_RATE_REGEX) -> None:
        self.regex = compile_rate_regex(regex) if isinstance(regex, str) else regex
        self.rate: float | None = None
        self.line: str | None = None

    def feed(self, lines: list[str]) -> None:
        for line in lines:
            for m in self.regex.finditer(line):
                raw = m.group("rate") if "rate" in self.regex.groupindex else m.group(1)
                try:
                    self.rate = float(raw)
                    self.line = line[:RATE_LINE_MAX_CHARS]
                except (TypeError, ValueError):
                    continue

    def to_json(self) -> dict[str, Any]:
        return {"regex": self.regex.pattern, "rate": self.rate, "line": self.line}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "RateParser":
        parser = cls(doc["regex"])
        parser.rate, parser.line = doc.get("rate"), doc.get("line")
        return parser


PROOF_RE = re.compile(r"(?i)\bproof\s+#?(\d+)\s*/\s*(\d+)\b(.*)")
PROOF_DONE_RE = re.compile(r"(?i)\b(?:done|finished|completed?|succeeded|ok)\b")
PROOF_FAILED_RE = re.compile(r"(?i)fail|error|abort")


class ProofCounter:
    """The distinct numbered proofs a run's lines say were completed, and the last ``n`` of ``i/n``."""

    def __init__(self) -> None:
        self.done: set[int] = set()
        self.total: int | None = None  # None: no numbered proof line seen yet

    @property
    def count(self) -> int | None:
        return None if self.total is None else len(self.done)

    def feed(self, lines: list[str]) -> None:
        for line in lines:
            if "roof" not in line:  # "proof" or "Proof": most lines are ruled out before the regex
                continue
            m = PROOF_RE.search(line)
            if m is None:
                continue
            i, n, rest = int(m.group(1)), int(m.group(2)), m.group(3)
            self.total = n
            if 1 <= i <= n and PROOF_DONE_RE.search(rest) and not PROOF_FAILED_RE.search(rest):
                self.done.add(i)

    def to_json(self) -> dict[str, Any]:
        """``done`` as ranges ([first, last] pairs): a 300-proof run is one pair, not 300 numbers."""
        ranges: list[list[int]] = []
        for i in sorted(self.done):
            if ranges and ranges[-1][1] == i - 1:
                ranges[-1][1] = i
            else:
                ranges.append([i, i])
        return {"done": ranges, "total": self.total}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "ProofCounter":
        counter = cls()
        counter.total = doc.get("total")
        for first, last in doc.get("done") or []:
            counter.done.update(range(first, last + 1))
        return counter


# Substrings that every match of ERROR_RE contains: most lines are ruled out by ``in`` (about
# 1 us) before the regex runs (about 15 us on a 100-character line).
_ERROR_HINTS = ("err", "fatal", "panic", "fail", "exception", "traceback", "segfault", "segmentation", "abort", "killed", "memory", "oom", "time", "cannot", "unable")


def looks_like_error(line: str) -> bool:
    if line[:1] == "E" and line[1:5].isdigit():  # glog: E1129 11:31:08.123456 ...
        return True
    low = line.lower()
    return any(hint in low for hint in _ERROR_HINTS) and ERROR_RE.search(line) is not None


class Evidence:
    """The recent lines of each stream (``benchdaemon``, ``stderr``, ...) and its error-looking ones.

    Everything is kept per stream, so the excerpt depends only on each stream's own lines in their
    order, never on how reads of different streams interleaved: an agent restarted after a crash
    reads the same lines with other interleavings, and must give the same excerpt."""

    def __init__(self, last_lines: int = EXCERPT_LAST_LINES, error_lines: int = EXCERPT_ERROR_LINES) -> None:
        self._last: dict[str, deque[str]] = {}
        self._errors: dict[str, deque[str]] = {}
        self._last_lines = last_lines
        self._error_lines = error_lines
        self._order: list[str] = []  # every stream, in the order it was tracked
        self._for_excerpt: list[str] = []  # the streams whose last lines are shown, in order

    def track(self, label: str, *, show_last_lines: bool = True) -> None:
        if label not in self._last:
            self._last[label] = deque(maxlen=self._last_lines)
            self._errors[label] = deque(maxlen=self._error_lines)
            self._order.append(label)
            if show_last_lines:
                self._for_excerpt.append(label)

    def feed(self, label: str, lines: list[str]) -> None:
        self.track(label)
        last, errors = self._last[label], self._errors[label]
        for line in lines:
            kept = line if len(line) <= EXCERPT_MAX_LINE_CHARS else line[: EXCERPT_MAX_LINE_CHARS + 1]  # the excerpt cuts it anyway
            last.append(kept)
            if looks_like_error(line):
                errors.append(kept)

    def to_json(self) -> dict[str, Any]:
        return {
            "last_lines": self._last_lines,
            "error_lines": self._error_lines,
            "streams": [
                {"label": label, "shown": label in self._for_excerpt, "last": list(self._last[label]), "errors": list(self._errors[label])}
                for label in self._order
            ],
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "Evidence":
        evidence = cls(doc["last_lines"], doc["error_lines"])
        for stream in doc["streams"]:
            label = stream["label"]
            evidence.track(label, show_last_lines=stream["shown"])
            evidence._last[label].extend(stream["last"])
            evidence._errors[label].extend(stream["errors"])
        return evidence

    def _errors_shown(self) -> list[tuple[str, list[str]]]:
        """The last error-looking lines of each stream, ``error_lines`` in all, shared out evenly
        (a stream with fewer leaves its share to the others)."""
        counts = {label: len(self._errors[label]) for label in self._order}
        shown = dict.fromkeys(counts, 0)
        left = self._error_lines
        while left and any(shown[label] < n for label, n in counts.items()):
            for label, n in counts.items():
                if left and shown[label] < n:
                    shown[label] += 1
                    left -= 1
        return [(label, list(self._errors[label])[counts[label] - shown[label]:]) for label in self._order if shown[label]]

    def excerpt(self, max_chars: int = EXCERPT_MAX_CHARS) -> str:
        def cut(line: str) -> str:
            return line if len(line) <= EXCERPT_MAX_LINE_CHARS else line[:EXCERPT_MAX_LINE_CHARS] + "…"

        parts: list[str] = []
        errors = self._errors_shown()
        if errors:
            parts.append("== error-looking lines ==")
            parts += [f"[{label}] {cut(line)}" for label, lines in errors for line in lines]
        for label in self._for_excerpt:
            if self._last[label]:
                parts.append(f"== last lines of {label} ==")
                parts += [cut(line) for line in self._last[label]]
        text = "\n".join(parts)
        return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


class Findings:
    """What the agent derives from a run's output: the failure excerpt's evidence and, for a
    benchmark, the rate (of ``rate_source``'s lines) and the proofs completed (of every stream's).
    Persisted with the run (``RunState.findings``)."""

    def __init__(self, evidence: Evidence | None = None, rate: RateParser | None = None, rate_source: str | None = None,
                 proofs: ProofCounter | None = None) -> None:
        self.evidence = evidence or Evidence()
        self.rate = rate
        self.rate_source = rate_source
        self.proofs = proofs

    @classmethod
    def for_run(cls, run: dict[str, Any]) -> "Findings":
        """A new ``run`` or ``wrap`` run's (``RunState.run``): the excerpt's streams in its order, each
        tailed log first (the daemon's last words), then the command's stdout (its error-looking lines
        only) and stderr, tracked before any line is read; for ``run`` (``bench``), the rate of its source."""
        evidence = Evidence()
        for source, _path in run.get("tails", []):
            evidence.track(source)
        evidence.track("stdout", show_last_lines=False)
        evidence.track("stderr")
        rate = RateParser(run["rate_regex"]) if run.get("bench") else None
        return cls(evidence, rate, run["source"] if rate is not None else None, ProofCounter() if run.get("bench") else None)

    def feed(self, source: str, labelled: list[tuple[str, list[str]]]) -> None:
        """The lines of one spool record: runs of (label, lines) in read order."""
        for label, lines in labelled:
            self.evidence.feed(label, lines)
            if self.rate is not None and source == self.rate_source:
                self.rate.feed(lines)
            if self.proofs is not None:
                self.proofs.feed(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "evidence": self.evidence.to_json(),
            "rate": self.rate.to_json() if self.rate is not None else None,
            "rate_source": self.rate_source,
            "proofs": self.proofs.to_json() if self.proofs is not None else None,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "Findings":
        rate = RateParser.from_json(doc["rate"]) if doc.get("rate") else None
        proofs = ProofCounter.from_json(doc["proofs"]) if doc.get("proofs") else None  # None: kept by an older agent
        return cls(Evidence.from_json(doc["evidence"]), rate, doc.get("rate_source"), proofs)
