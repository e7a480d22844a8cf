"""NVML, through nvidia-ml-py (``import pynvml``): each GPU's identity, one sample of its fields, Xid events.

The NVML module is a seam: ``load(None)`` imports the real ``pynvml``; ``load("pkg.mod:attr")`` or
``load("/path/file.py:attr")`` imports another module (or an object in it) that behaves like it,
which is how the tests run the real agent on a fake NVML with values recorded from a real card. Everything here takes the module
object as an argument and never imports ``pynvml`` itself.

Values follow NVIDIA DCGM-exporter's names and units (``DCGM_FI_DEV_FB_USED`` in MiB,
``DCGM_FI_DEV_POWER_USAGE`` in W, ...). Each NVML call is probed once per GPU: a call that answers
NotSupported (or whose function this driver lacks) is recorded as unsupported and never made again.
A call answering GPU_IS_LOST raises ``GpuLost``; any other error skips that call in this sample
only, and is counted.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

logger = logging.getLogger(__name__)

MIB = 1024 * 1024
XID_GPU_LOST = 79  # "GPU has fallen off the bus"

# name -> (unit, description): the gauges this agent exports
FIELDS: dict[str, tuple[str, str]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("%", "GPU utilization"),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("%", "memory (copy engine) utilization"),
    "DCGM_FI_DEV_FB_USED": ("MiB", "frame buffer memory used"),
    "DCGM_FI_DEV_FB_FREE": ("MiB", "frame buffer memory free"),
    "DCGM_FI_DEV_GPU_TEMP": ("Cel", "GPU temperature"),
    "DCGM_FI_DEV_POWER_USAGE": ("W", "power draw"),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("mJ", "energy consumed since the driver was loaded"),
    "DCGM_FI_DEV_SM_CLOCK": ("MHz", "SM clock"),
    "DCGM_FI_DEV_MEM_CLOCK": ("MHz", "memory clock"),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("1", "clock event (throttle) reasons, a bit mask"),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("1", "PCIe replays"),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("1", "single-bit ECC errors since the driver was loaded"),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("1", "double-bit ECC errors since the driver was loaded"),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("1", "rows remapped for correctable errors"),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("1", "rows remapped for uncorrectable errors"),
    "DCGM_FI_DEV_XID_ERRORS": ("1", "the last Xid error seen"),
}


class NvmlUnavailable(Exception):
    """NVML cannot be used at all: the library is missing, the driver not loaded, no permission."""


class GpuLost(Exception):
    """A call answered NVML_ERROR_GPU_IS_LOST."""


def load(spec: str | None):
    """The NVML module: ``pynvml``, or what ``spec`` names: ``package.module`` or ``/path/to/file.py``,
    either followed by ``:attribute`` for an object in it."""
    target, attr = spec or "pynvml", ""
    if ":" in target:
        target, attr = target.rsplit(":", 1)
    try:
        if target.endswith(".py"):
            name = "fleetlog_nvml_" + os.path.basename(target)[:-3]
            found = importlib.util.spec_from_file_location(name, target)
            if found is None or found.loader is None:
                raise ImportError(f"not a Python file: {target}")
            module = importlib.util.module_from_spec(found)
            sys.modules[name] = module
            found.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except (ImportError, OSError) as e:
        raise NvmlUnavailable(f"cannot import {target} (is nvidia-ml-py installed?): {e}") from e
    if not attr:
        return module
    try:
        return getattr(module, attr)
    except AttributeError as e:
        raise NvmlUnavailable(f"{target} has no {attr}") from e


def error_code(nv, e: BaseException) -> int | None:
    return getattr(e, "value", None) if isinstance(e, nv.NVMLError) else None


def describe(nv, e: BaseException) -> str:
    code = error_code(nv, e)
    text = str(e) or type(e).__name__
    return f"{text} (NVML error {code})" if code is not None else text


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


# ---- the calls of one sample: (key, function of (nv, handle) -> {field: value}) ----------------


def _utilization(nv, h) -> dict[str, float]:
    u = nv.nvmlDeviceGetUtilizationRates(h)
    return {"DCGM_FI_DEV_GPU_UTIL": u.gpu, "DCGM_FI_DEV_MEM_COPY_UTIL": u.memory}


def _memory(nv, h) -> dict[str, float]:
    m = nv.nvmlDeviceGetMemoryInfo(h)
    return {"DCGM_FI_DEV_FB_USED": round(m.used / MIB), "DCGM_FI_DEV_FB_FREE": round(m.free / MIB)}


def _temperature(nv, h) -> dict[str, float]:
    return {"DCGM_FI_DEV_GPU_TEMP": nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)}


def _power(nv, h) -> dict[str, float]:
    return {"DCGM_FI_DEV_POWER_USAGE": nv.nvmlDeviceGetPowerUsage(h) / 1000.0}  # mW -> W


def _energy(nv, h) -> dict[str, float]:
    return {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": nv.nvmlDeviceGetTotalEnergyConsumption(h)}  # mJ


def _sm_clock(nv, h) -> dict[str, float]:
    return {"DCGM_FI_DEV_SM_CLOCK": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)}


def _mem_clock(nv, h) -> dict[str, float]:
    return {"DCGM_FI_DEV_MEM_CLOCK": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)}


def _clock_reasons(nv, h) -> dict[str, float]:
    # "clock event reasons" since driver 535; older drivers (and bindings) know "throttle reasons"
    fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if fn is not None:
        try:
            return {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": fn(h)}
        except nv.NVMLError as e:
            if error_code(nv, e) != nv.NVML_ERROR_FUNCTION_NOT_FOUND:
                raise
    return {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": nv.nvmlDeviceGetCurrentClocksThrottleReasons(h)}


def _pcie_replay(nv, h) -> dict[str, float]:
    return {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER": nv.nvmlDeviceGetPcieReplayCounter(h)}


def _ecc_sbe(nv, h) -> dict[str, float]:
    n = nv.nvmlDeviceGetTotalEccErrors(h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC)
    return {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": n}


def _ecc_dbe(nv, h) -> dict[str, float]:
    n = nv.nvmlDeviceGetTotalEccErrors(h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)
    return {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": n}


def _remapped_rows(nv, h) -> dict[str, float]:
    correctable, uncorrectable, _pending, _failure = nv.nvmlDeviceGetRemappedRows(h)
    return {"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": correctable, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": uncorrectable}


# key, the fields it gives, the call
CALLS: tuple[tuple[str, tuple[str, ...], Callable[[Any, Any], dict[str, float]]], ...] = (
    ("utilization", ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL"), _utilization),
    ("memory", ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"), _memory),
    ("temperature", ("DCGM_FI_DEV_GPU_TEMP",), _temperature),
    ("power", ("DCGM_FI_DEV_POWER_USAGE",), _power),
    ("energy", ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",), _energy),
    ("sm_clock", ("DCGM_FI_DEV_SM_CLOCK",), _sm_clock),
    ("mem_clock", ("DCGM_FI_DEV_MEM_CLOCK",), _mem_clock),
    ("clock_reasons", ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",), _clock_reasons),
    ("pcie_replay", ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER",), _pcie_replay),
    ("ecc_sbe", ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",), _ecc_sbe),
    ("ecc_dbe", ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",), _ecc_dbe),
    ("remapped_rows", ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"), _remapped_rows),
)


@dataclass
class Device:
    """One GPU: its labels (DCGM-exporter's), which calls it does not support, its last Xid."""

    index: int
    handle: Any
    uuid: str = ""
    name: str = ""
    pci_bus_id: str = ""
    unsupported: set[str] = field(default_factory=set)  # keys of CALLS
    probed: set[str] = field(default_factory=set)
    complained: set[str] = field(default_factory=set)  # keys whose failure was logged (once each)
    errors: int = 0  # NVML errors other than NotSupported and GPU_IS_LOST
    exceptions: int = 0  # anything else
    last_xid: int | None = None
    lost: str | None = None  # why, once lost

    def labels(self, driver: str, machine_id: int | None) -> dict[str, str]:
        out = {"gpu": str(self.index), "UUID": self.uuid, "device": f"nvidia{self.index}", "modelName": self.name,
               "pci_bus_id": self.pci_bus_id, "DCGM_FI_DRIVER_VERSION": driver}
        if machine_id is not None:
            out["machine_id"] = str(machine_id)
        return out

    def sample(self, nv) -> dict[str, float]:
        """One value of every supported field (the Xid is the sampler's); raises ``GpuLost``."""
        out: dict[str, float] = {}
        for key, _fields, call in CALLS:
            if key in self.unsupported:
                continue
            try:
                values = call(nv, self.handle)
            except nv.NVMLError as e:
                code = error_code(nv, e)
                if code == nv.NVML_ERROR_GPU_IS_LOST:
                    raise GpuLost(f"{key}: {describe(nv, e)}") from e
                if code in (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_FUNCTION_NOT_FOUND):
                    self.unsupported.add(key)
                    logger.info("GPU %d does not support %s (%s); not asking again", self.index, key, describe(nv, e))
                else:
                    self.errors += 1
                    if key not in self.complained:
                        self.complained.add(key)
                        logger.warning("GPU %d: %s failed: %s (counted; logged once)", self.index, key, describe(nv, e))
                self.probed.add(key)
                continue
            except Exception:  # not NVML's: a bug, or a binding that changed; this field only is lost
                self.exceptions += 1
                if key not in self.complained:
                    self.complained.add(key)
                    logger.exception("GPU %d: reading %s failed (counted; logged once)", self.index, key)
                self.probed.add(key)
                continue
            self.probed.add(key)
            out.update({k: float(v) for k, v in values.items()})
        return out

    def unsupported_fields(self) -> list[str]:
        return [name for key, fields, _call in CALLS if key in self.unsupported for name in fields]


class Nvml:
    """An initialized NVML: the driver version and the devices. ``open`` raises ``NvmlUnavailable``."""

    def __init__(self, nv) -> None:
        self.nv = nv
        self.driver = ""
        self.devices: list[Device] = []
        self._open = False

    def open(self) -> None:
        nv = self.nv
        try:
            nv.nvmlInit()
        except nv.NVMLError as e:
            raise NvmlUnavailable(f"nvmlInit: {describe(nv, e)}") from e
        except OSError as e:  # a broken libnvidia-ml.so
            raise NvmlUnavailable(f"nvmlInit: {e}") from e
        self._open = True
        try:
            self.driver = _text(nv.nvmlSystemGetDriverVersion())
        except nv.NVMLError as e:
            logger.warning("driver version unknown: %s", describe(nv, e))
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as e:
            self.close()
            raise NvmlUnavailable(f"nvmlDeviceGetCount: {describe(nv, e)}") from e
        for index in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
            except nv.NVMLError as e:
                device = Device(index, None)
                if error_code(nv, e) == nv.NVML_ERROR_GPU_IS_LOST:
                    device.lost = f"nvmlDeviceGetHandleByIndex: {describe(nv, e)}"
                    self.devices.append(device)
                else:
                    logger.warning("GPU %d skipped: %s", index, describe(nv, e))
                continue
            device = Device(index, handle)
            for attr, call in (("uuid", nv.nvmlDeviceGetUUID), ("name", nv.nvmlDeviceGetName)):
                try:
                    setattr(device, attr, _text(call(handle)))
                except nv.NVMLError as e:
                    logger.warning("GPU %d: %s failed: %s", index, call.__name__, describe(nv, e))
            try:
                device.pci_bus_id = _text(nv.nvmlDeviceGetPciInfo(handle).busId)
            except nv.NVMLError as e:
                logger.warning("GPU %d: PCI info failed: %s", index, describe(nv, e))
            self.devices.append(device)

    def close(self) -> None:
        if self._open:
            self._open = False
            try:
                self.nv.nvmlShutdown()
            except self.nv.NVMLError as e:
                logger.warning("nvmlShutdown: %s", describe(self.nv, e))

    def device_of_event(self, data) -> Device | None:
        """The device an event came from, by its handle (a lost GPU answers no query)."""
        for device in self.devices:
            if device.handle is not None and _address(device.handle) == _address(data.device):
                return device
        return None


def _address(handle: Any) -> int:
    """A handle's identity: the pointer's value for the real library's handles, else the object's."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value or 0
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


class XidEvents:
    """``nvmlEventSetCreate`` + ``nvmlDeviceRegisterEvents(Xid critical errors)`` on every device that
    supports it; ``wait(timeout_ms)`` returns (device, xid) or None on a timeout."""

    def __init__(self, nvml: Nvml) -> None:
        self.nvml = nvml
        nv = nvml.nv
        self.event_set = nv.nvmlEventSetCreate()
        self.registered: list[Device] = []
        for device in nvml.devices:
            if device.handle is None or device.lost:
                continue
            try:
                nv.nvmlDeviceRegisterEvents(device.handle, nv.nvmlEventTypeXidCriticalError, self.event_set)
                self.registered.append(device)
            except nv.NVMLError as e:
                logger.info("GPU %d: Xid events unavailable: %s", device.index, describe(nv, e))

    def wait(self, timeout_ms: int) -> tuple[Device | None, int] | None:
        nv = self.nvml.nv
        try:
            data = nv.nvmlEventSetWait_v2(self.event_set, timeout_ms)
        except nv.NVMLError as e:
            if error_code(nv, e) == nv.NVML_ERROR_TIMEOUT:
                return None
            raise
        if not data.eventType & nv.nvmlEventTypeXidCriticalError:
            return None
        return self.nvml.device_of_event(data), int(data.eventData)

    def close(self) -> None:
        nv = self.nvml.nv
        try:
            nv.nvmlEventSetFree(self.event_set)
        except nv.NVMLError as e:
            logger.warning("nvmlEventSetFree: %s", describe(nv, e))
