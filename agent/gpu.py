"""The GPUs of this machine, as ``nvidia-smi`` reports them (nothing when it is absent or fails)."""

from __future__ import annotations

import logging
import shutil
import subprocess
from typing import Any

logger = logging.getLogger(__name__)

QUERY = ["--query-gpu=name,driver_version", "--format=csv,noheader"]


def parse_query(text: str) -> dict[str, Any]:
    """``NVIDIA RTX PRO 4000, 575.57.08`` per GPU → gpu_model, gpu_count, driver."""
    rows = [[cell.strip() for cell in line.split(",")] for line in text.splitlines() if line.strip()]
    if not rows:
        return {}
    out: dict[str, Any] = {"gpu_model": rows[0][0], "gpu_count": len(rows)}
    if len(rows[0]) > 1 and rows[0][1]:
        out["driver"] = rows[0][1]
    return out


def detect(nvidia_smi: str = "nvidia-smi", timeout_s: float = 10.0) -> dict[str, Any]:
    path = shutil.which(nvidia_smi)
    if path is None:
        return {}
    try:
        done = subprocess.run([path, *QUERY], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        logger.warning("nvidia-smi failed: %s", e)
        return {}
    if done.returncode != 0:
        logger.warning("nvidia-smi exited with %d: %s", done.returncode, done.stderr.strip()[:200])
        return {}
    return parse_query(done.stdout)
