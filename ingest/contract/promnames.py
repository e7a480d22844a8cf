"""Prometheus's naming rules, for the GPU samples that /metrics exposes under their own names.

Samples named ``DCGM_FI_*`` (DCGM-exporter's names) feed the GPU gauges (``ingest/db/gauges.py``):
their name becomes a metric name and their labels become label names and values. Prometheus refuses
a whole scrape over one bad name, so these rules hold at every door and again at the exposition:

- a metric name matches ``[a-zA-Z_:][a-zA-Z0-9_:]*``;
- a label name matches ``[a-zA-Z_][a-zA-Z0-9_]*`` and does not start with ``__`` (Prometheus's own,
  ``__name__`` among them);
- a sample's labels hold at most ``MAX_LABEL_CHARS`` characters, names and values together (a scrape's
  size is then bounded by the series caps).

The JSON push refuses a sample that breaks them (400 naming the field). OTLP attribute keys are first
translated as Prometheus's own OTLP receiver does (each character outside ``[a-zA-Z0-9_]`` becomes
``_``: ``gpu.uuid`` is ``gpu_uuid``), then checked; a point that still breaks them is refused alone
(``partial_success``). The exposition translates and checks again, dropping and counting what fails,
so that rows stored before these checks (or written by any other path) cannot break a scrape.
Label values are free text: prometheus-client escapes ``\\``, ``"`` and newlines.
"""

from __future__ import annotations

import re

GAUGE_PREFIX = "DCGM_FI_"
MAX_LABEL_CHARS = 1024

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_NOT_LABEL_CHAR = re.compile(r"[^a-zA-Z0-9_]")


def feeds_gauges(name: str) -> bool:
    return name.startswith(GAUGE_PREFIX)


def check_metric_name(name: str) -> str | None:
    """Why ``name`` is not a Prometheus metric name, or None when it is."""
    if _METRIC_NAME.fullmatch(name) is None:
        return "must match [a-zA-Z_:][a-zA-Z0-9_:]* to be exposed on /metrics"
    return None


def check_label_name(key: str) -> str | None:
    """Why ``key`` is not a Prometheus label name, or None when it is."""
    if _LABEL_NAME.fullmatch(key) is None:
        return "must match [a-zA-Z_][a-zA-Z0-9_]* to be exposed on /metrics"
    if key.startswith("__"):
        return "must not start with '__' (reserved for Prometheus)"
    return None


def translate(key: str) -> str:
    """An OTLP attribute key as a label name, the way Prometheus's OTLP receiver writes it."""
    return _NOT_LABEL_CHAR.sub("_", key)


def check_labels(labels: dict[str, str], *, translated: bool = False) -> str | None:
    """Why these labels cannot be exposed, or None. ``translated``: keys go through ``translate`` first."""
    size = 0
    for key, value in labels.items():
        why = check_label_name(translate(key) if translated else key)
        if why is not None:
            return f"label {key[:40]!r} {why}"
        size += len(key) + len(value)
    if size > MAX_LABEL_CHARS:
        return f"labels hold {size} characters, over the {MAX_LABEL_CHARS} a GPU sample may carry"
    return None
