"""Host memory, as the kernel and the container's cgroup report it (beside NVML: a PCE extraction can
run the host, not the GPU, out of memory, and the kernel or the cgroup then kills the daemon).

What is read, from two roots that are seams (settings ``--proc-root``, ``--cgroup-root``; the tests
point them at a fake tree, as prometheus client_python's ``tests/proc`` does):

- ``<proc>/meminfo``: ``MemAvailable`` and ``MemTotal`` (kB, reported in bytes);
- the container's cgroup: ``<cgroup>`` itself, or ``<cgroup>/<path>`` when ``<proc>/self/cgroup`` names
  a cgroup v2 path (``0::/path``) that exists under it. cgroup v2: ``memory.current``, ``memory.max``
  (``max`` is no limit: None) and ``memory.events``' ``oom_kill``; else cgroup v1 under
  ``<cgroup>/memory``: ``memory.usage_in_bytes``, ``memory.limit_in_bytes`` (the kernel's "no limit",
  about 2^63, is None) and ``memory.oom_control``'s ``oom_kill`` (kernels >= 4.13).

Every value is None when its file is missing or does not parse: reading never fails.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_PROC_ROOT = "/proc"
DEFAULT_CGROUP_ROOT = "/sys/fs/cgroup"
V1_NO_LIMIT = 2**62  # cgroup v1 says "no limit" with PAGE_COUNTER_MAX pages, about 2^63 bytes


@dataclass(frozen=True)
class HostMemory:
    available_bytes: int | None = None
    total_bytes: int | None = None
    cgroup_current_bytes: int | None = None
    cgroup_max_bytes: int | None = None  # None: no limit, or unknown
    oom_kills: int | None = None  # processes the cgroup's OOM killer killed, since the cgroup was made


def _text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _int(path: str) -> int | None:
    text = _text(path)
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def _keyed(path: str, key: str, *, sep: str | None = None) -> str | None:
    """The value of ``key`` in a file of ``key value`` lines (``key: value`` with ``sep=':'``)."""
    text = _text(path)
    for line in (text or "").splitlines():
        name, _, value = line.partition(sep) if sep else line.partition(" ")
        if name.strip() == key:
            return value.strip()
    return None


def _keyed_int(path: str, key: str) -> int | None:
    value = _keyed(path, key)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _meminfo_bytes(proc_root: str, key: str) -> int | None:
    value = _keyed(os.path.join(proc_root, "meminfo"), key, sep=":")
    if value is None:
        return None
    number, _, unit = value.partition(" ")
    try:
        return int(number) * (1024 if unit.strip() == "kB" else 1)
    except ValueError:
        return None


def cgroup_dir(proc_root: str, cgroup_root: str) -> str:
    """The container's own cgroup v2 directory (the root itself in a container's cgroup namespace)."""
    for line in (_text(os.path.join(proc_root, "self", "cgroup")) or "").splitlines():
        if line.startswith("0::"):
            path = os.path.join(cgroup_root, line[3:].strip().lstrip("/"))
            if os.path.exists(os.path.join(path, "memory.current")):
                return path
    return cgroup_root


def oom_kills(proc_root: str = DEFAULT_PROC_ROOT, cgroup_root: str = DEFAULT_CGROUP_ROOT) -> int | None:
    return read(proc_root, cgroup_root).oom_kills


def read(proc_root: str = DEFAULT_PROC_ROOT, cgroup_root: str = DEFAULT_CGROUP_ROOT) -> HostMemory:
    directory = cgroup_dir(proc_root, cgroup_root)
    current = _int(os.path.join(directory, "memory.current"))
    if current is not None or os.path.exists(os.path.join(directory, "memory.events")):  # cgroup v2
        limit = _int(os.path.join(directory, "memory.max"))  # "max": no limit
        kills = _keyed_int(os.path.join(directory, "memory.events"), "oom_kill")
    else:  # cgroup v1
        v1 = os.path.join(cgroup_root, "memory")
        current = _int(os.path.join(v1, "memory.usage_in_bytes"))
        limit = _int(os.path.join(v1, "memory.limit_in_bytes"))
        if limit is not None and limit >= V1_NO_LIMIT:
            limit = None
        kills = _keyed_int(os.path.join(v1, "memory.oom_control"), "oom_kill")
    return HostMemory(
        available_bytes=_meminfo_bytes(proc_root, "MemAvailable"),
        total_bytes=_meminfo_bytes(proc_root, "MemTotal"),
        cgroup_current_bytes=current,
        cgroup_max_bytes=limit,
        oom_kills=kills,
    )
