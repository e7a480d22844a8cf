"""A fake ``pynvml`` (nvidia-ml-py) with values of real cards under a proving load, for the GPU sampler.

``FakeNvml`` instances behave like the module: the same function names, constants and NVMLError
classes (an error's ``value`` is its NVML code). Each keeps a count of the calls it saw per
(function, GPU index), so a test can check that an unsupported call was made exactly once.

The agent gets one through its seam: in-process, ``GpuTelemetry.start(nv=FakeNvml(...))``; in a
subprocess, ``--nvml-module fake_pynvml:NAME`` (or ``FLEETLOG_AGENT_NVML_MODULE``) with this
directory on PYTHONPATH, NAME one of the scenarios at the bottom.

The values are those of an RTX 4090 under a proving load, in NVML's own units (bytes, mW, mJ, MHz),
as nvidia-smi shows such a card: 97 % utilization, 23.5 of 24 GiB used, 81 C, 285 W, SM 2520 MHz,
memory 10501 MHz, the software power cap among the clock event reasons; ECC and row remapping answer
NotSupported, as on GeForce cards. (Typical figures written down by hand, not a capture of one card.)
"""

from __future__ import annotations

import queue
import threading
from collections import Counter
from dataclasses import dataclass
from types import SimpleNamespace

GIB = 1024**3

# the constants the agent reads, with pynvml's values
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
nvmlEventTypeXidCriticalError = 0x0000000000000008
nvmlClocksEventReasonSwPowerCap = 0x0000000000000004

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML Error with code {self.value}")


class NVMLError_NotSupported(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_NOT_SUPPORTED)


class NVMLError_GpuIsLost(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_GPU_IS_LOST)


@dataclass
class Card:
    """One GPU's recorded values; ``unsupported`` names the functions that answer NotSupported."""

    name: str
    uuid: str
    pci_bus_id: str
    util_gpu: int
    util_memory: int
    memory_total: int
    memory_used: int
    temperature_c: int
    power_mw: int
    energy_mj: int
    sm_clock_mhz: int
    mem_clock_mhz: int
    clock_reasons: int
    pcie_replays: int = 0
    ecc_sbe: int = 0
    ecc_dbe: int = 0
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)
    unsupported: frozenset[str] = frozenset()
    lost_after_samples: int | None = None  # the (n+1)-th utilization call on finds the GPU lost
    xid_when_lost: bool = True  # and an Xid 79 event comes with it
    calls_raise_when_lost: bool = True
    hang_on: str | None = None  # a function that never returns (a wedged driver) until release()


def rtx_4090(index: int = 0, **changes) -> Card:
    card = Card(
        name="NVIDIA GeForce RTX 4090",
        uuid=f"GPU-8f6bd1a2-3c4e-5f60-7a8b-9c0d1e2f3a{index:02x}",
        pci_bus_id=f"00000000:{0x01 + index:02X}:00.0",
        util_gpu=97, util_memory=62,
        memory_total=24 * GIB, memory_used=23 * GIB + GIB // 2,
        temperature_c=81, power_mw=285_412, energy_mj=1_843_226_417,
        sm_clock_mhz=2520, mem_clock_mhz=10501, clock_reasons=nvmlClocksEventReasonSwPowerCap,
        pcie_replays=0,
        unsupported=frozenset({"nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows"}),
    )
    for key, value in changes.items():
        setattr(card, key, value)
    return card


@dataclass
class _Handle:
    index: int


class FakeNvml:
    """The ``pynvml`` module over a list of cards."""

    NVMLError = NVMLError

    def __init__(self, cards: list[Card], *, init_error: int | None = None, driver: str = "575.57.08") -> None:
        self.cards = cards
        self.init_error = init_error
        self.driver = driver
        self.calls: Counter[tuple[str, int | None]] = Counter()
        self.initialized = 0
        self.shutdowns = 0
        self.samples = [0] * len(cards)  # utilization calls per GPU
        self.lost = [False] * len(cards)
        self.events: queue.Queue = queue.Queue()
        self.event_sets: list[object] = []
        self._lock = threading.Lock()
        self._released = threading.Event()
        for name, value in globals().items():
            if name.startswith(("NVML_", "nvml")) and isinstance(value, int):
                setattr(self, name, value)

    # ---- test controls ----------------------------------------------------------------------

    def inject_xid(self, index: int, xid: int) -> None:
        self.events.put(SimpleNamespace(device=self._handles[index], eventType=nvmlEventTypeXidCriticalError, eventData=xid,
                                        gpuInstanceId=0, computeInstanceId=0))

    def release(self) -> None:
        """Let a call stuck on ``hang_on`` return."""
        self._released.set()

    def calls_of(self, function: str, index: int | None = None) -> int:
        return self.calls[(function, index)]

    # ---- the module -------------------------------------------------------------------------

    def _call(self, function: str, handle: _Handle | None) -> Card | None:
        index = None if handle is None else handle.index
        with self._lock:
            self.calls[(function, index)] += 1
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if handle is None:
            return None
        card = self.cards[index]
        if function == card.hang_on:
            self._released.wait()
        if self.lost[index] and card.calls_raise_when_lost:
            raise NVMLError_GpuIsLost()
        if function in card.unsupported:
            raise NVMLError_NotSupported()
        return card

    def nvmlInit(self) -> None:
        with self._lock:
            self.calls[("nvmlInit", None)] += 1
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialized += 1
        self._handles = [_Handle(i) for i in range(len(self.cards))]

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown", None)
        self.shutdowns += 1
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._call("nvmlSystemGetDriverVersion", None)
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount", None)
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._call("nvmlDeviceGetHandleByIndex", None)
        return self._handles[index]

    def nvmlDeviceGetName(self, h: _Handle) -> str:
        return self._call("nvmlDeviceGetName", h).name

    def nvmlDeviceGetUUID(self, h: _Handle) -> str:
        return self._call("nvmlDeviceGetUUID", h).uuid

    def nvmlDeviceGetPciInfo(self, h: _Handle):
        return SimpleNamespace(busId=self._call("nvmlDeviceGetPciInfo", h).pci_bus_id.encode())

    def nvmlDeviceGetUtilizationRates(self, h: _Handle):
        card = self._call("nvmlDeviceGetUtilizationRates", h)
        self.samples[h.index] += 1
        if card.lost_after_samples is not None and self.samples[h.index] > card.lost_after_samples and not self.lost[h.index]:
            self.lost[h.index] = True
            if card.xid_when_lost:
                self.inject_xid(h.index, 79)
            if card.calls_raise_when_lost:
                raise NVMLError_GpuIsLost()
        return SimpleNamespace(gpu=card.util_gpu, memory=card.util_memory)

    def nvmlDeviceGetMemoryInfo(self, h: _Handle):
        card = self._call("nvmlDeviceGetMemoryInfo", h)
        return SimpleNamespace(total=card.memory_total, used=card.memory_used, free=card.memory_total - card.memory_used)

    def nvmlDeviceGetTemperature(self, h: _Handle, sensor: int) -> int:
        assert sensor == NVML_TEMPERATURE_GPU
        return self._call("nvmlDeviceGetTemperature", h).temperature_c

    def nvmlDeviceGetPowerUsage(self, h: _Handle) -> int:
        return self._call("nvmlDeviceGetPowerUsage", h).power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h: _Handle) -> int:
        return self._call("nvmlDeviceGetTotalEnergyConsumption", h).energy_mj

    def nvmlDeviceGetClockInfo(self, h: _Handle, clock: int) -> int:
        card = self._call("nvmlDeviceGetClockInfo", h)
        return {NVML_CLOCK_SM: card.sm_clock_mhz, NVML_CLOCK_MEM: card.mem_clock_mhz}[clock]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: _Handle) -> int:
        return self._call("nvmlDeviceGetCurrentClocksEventReasons", h).clock_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: _Handle) -> int:
        return self._call("nvmlDeviceGetCurrentClocksThrottleReasons", h).clock_reasons

    def nvmlDeviceGetPcieReplayCounter(self, h: _Handle) -> int:
        return self._call("nvmlDeviceGetPcieReplayCounter", h).pcie_replays

    def nvmlDeviceGetTotalEccErrors(self, h: _Handle, error_type: int, counter_type: int) -> int:
        card = self._call("nvmlDeviceGetTotalEccErrors", h)
        assert counter_type == NVML_VOLATILE_ECC
        return card.ecc_sbe if error_type == NVML_MEMORY_ERROR_TYPE_CORRECTED else card.ecc_dbe

    def nvmlDeviceGetRemappedRows(self, h: _Handle) -> tuple[int, int, int, int]:
        return self._call("nvmlDeviceGetRemappedRows", h).remapped

    def nvmlEventSetCreate(self) -> object:
        self._call("nvmlEventSetCreate", None)
        event_set = object()
        self.event_sets.append(event_set)
        return event_set

    def nvmlDeviceRegisterEvents(self, h: _Handle, event_types: int, event_set: object) -> None:
        self._call("nvmlDeviceRegisterEvents", h)
        assert event_types & nvmlEventTypeXidCriticalError and event_set in self.event_sets

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int):
        self._call("nvmlEventSetWait_v2", None)
        try:
            return self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise NVMLError(NVML_ERROR_TIMEOUT) from None

    def nvmlEventSetFree(self, event_set: object) -> None:
        self._call("nvmlEventSetFree", None)
        self.event_sets.remove(event_set)


# ---- scenarios for a subprocess agent (--nvml-module fake_pynvml:NAME) -------------------------

rtx4090 = FakeNvml([rtx_4090()])
rtx4090_lost = FakeNvml([rtx_4090(lost_after_samples=3)])  # GPU_IS_LOST on a call, and Xid 79
no_driver = FakeNvml([rtx_4090()], init_error=NVML_ERROR_DRIVER_NOT_LOADED)
wedged = FakeNvml([rtx_4090(hang_on="nvmlDeviceGetPowerUsage")])  # the 1st sample never returns
