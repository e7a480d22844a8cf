"""What a finished benchmark says: its rate, and the evidence of why it failed.

The rate is the last match of the rate pattern in the command's output (stdout and stderr); no
match means no rate (``None``), never 0: "the wrapper parsed nothing" and "the machine proved
nothing" are different facts, and confusing them is how the incident's ``0 proofs/hour`` came about.

The failure excerpt keeps the last lines of every tailed log (the daemon's) and of stderr, and puts
the error-looking lines of all of them (stdout too) first, because the first question is "what
went wrong" and the daemon's last words are usually the answer.
"""

from __future__ import annotations

import re
from collections import deque

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
                    self.line = line
                except (TypeError, ValueError):
                    continue


# Substrings that every match of ERROR_RE contains: most lines are ruled out by ``in`` (about
# 1 us) before the regex runs (about 15 us on a 100-character line).
_ERROR_HINTS = ("err", "fatal", "panic", "fail", "exception", "traceback", "segfault", "segmentation", "abort", "killed", "memory", "oom", "time", "cannot", "unable")


def looks_like_error(line: str) -> bool:
    if line[:1] == "E" and line[1:5].isdigit():  # glog: E1129 11:31:08.123456 ...
        return True
    low = line.lower()
    return any(hint in low for hint in _ERROR_HINTS) and ERROR_RE.search(line) is not None


class Evidence:
    """The recent lines of each stream (``benchdaemon``, ``stderr``, ...) and the error-looking ones."""

    def __init__(self, last_lines: int = EXCERPT_LAST_LINES, error_lines: int = EXCERPT_ERROR_LINES) -> None:
        self._last: dict[str, deque[str]] = {}
        self._errors: deque[tuple[str, str]] = deque(maxlen=error_lines)
        self._last_lines = last_lines
        self._for_excerpt: list[str] = []  # the streams whose last lines are shown, in order

    def track(self, label: str, *, show_last_lines: bool = True) -> None:
        if label not in self._last:
            self._last[label] = deque(maxlen=self._last_lines)
            if show_last_lines:
                self._for_excerpt.append(label)

    def feed(self, label: str, lines: list[str]) -> None:
        self.track(label)
        last = self._last[label]
        for line in lines:
            last.append(line)
            if looks_like_error(line):
                self._errors.append((label, line))

    def excerpt(self, max_chars: int = EXCERPT_MAX_CHARS) -> str:
        def cut(line: str) -> str:
            return line if len(line) <= EXCERPT_MAX_LINE_CHARS else line[:EXCERPT_MAX_LINE_CHARS] + "…"

        parts: list[str] = []
        if self._errors:
            parts.append("== error-looking lines ==")
            parts += [f"[{label}] {cut(line)}" for label, line in self._errors]
        for label in self._for_excerpt:
            if self._last[label]:
                parts.append(f"== last lines of {label} ==")
                parts += [cut(line) for line in self._last[label]]
        text = "\n".join(parts)
        return text if len(text) <= max_chars else text[: max_chars - 1] + "…"
