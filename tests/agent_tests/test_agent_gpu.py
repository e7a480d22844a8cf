"""GPU telemetry: the sampler on a fake NVML with a real card's values, the real agent exporting
through the OpenTelemetry SDK to the real server, NVML states as events; one test on the real NVML."""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import fake_pynvml
from agent.config import ConfigError, load
from agent.gpuexport import GpuTelemetry, same_origin
from agent.gpusampler import GpuSampler
from agent.nvml import Nvml, NvmlUnavailable, load as load_nvml
from agentlib import Api, REPO, assert_exactly_once, wait_until

FAKE = Path(fake_pynvml.__file__).resolve()
BASE = ["--server", "http://127.0.0.1:8080", "--instance-id", "C.32733029"]
UUID = "GPU-8f6bd1a2-3c4e-5f60-7a8b-9c0d1e2f3a00"


@pytest.fixture
def sampler():
    """``sampler(fake, **kw)``: a started GpuSampler on a fake NVML, stopped (and the fake released) at the end."""
    made: list[tuple[GpuSampler, fake_pynvml.FakeNvml]] = []

    def make(nv, interval_s=0.02, **kw) -> GpuSampler:
        s = GpuSampler(nv, interval_s=interval_s, xid_wait_ms=20, **kw)
        made.append((s, nv))
        s.start()
        return s

    yield make
    for s, nv in made:
        if nv is not None:
            nv.release()
        s.stop(5)


def states(events: list[dict]) -> list[tuple]:
    return [(e["state"], e.get("gpu")) for e in events]


# ---- the sampler, in-process -------------------------------------------------------------------


def test_a_4090_under_load_is_sampled_with_dcgm_names_units_and_labels(sampler):
    s = sampler(fake_pynvml.FakeNvml([fake_pynvml.rtx_4090()]), machine_id=55891)
    (sample,) = wait_until(s.latest, what="a sample")
    assert sample.values == {
        "DCGM_FI_DEV_GPU_UTIL": 97.0, "DCGM_FI_DEV_MEM_COPY_UTIL": 62.0,
        "DCGM_FI_DEV_FB_USED": 24064.0, "DCGM_FI_DEV_FB_FREE": 512.0,  # MiB: 23.5 of 24 GiB
        "DCGM_FI_DEV_GPU_TEMP": 81.0, "DCGM_FI_DEV_POWER_USAGE": 285.412,  # W, from mW
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 1843226417.0,
        "DCGM_FI_DEV_SM_CLOCK": 2520.0, "DCGM_FI_DEV_MEM_CLOCK": 10501.0,
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 4.0, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0.0,
    }
    assert sample.labels == {"gpu": "0", "UUID": UUID, "device": "nvidia0", "modelName": "NVIDIA GeForce RTX 4090",
                             "pci_bus_id": "00000000:01:00.0", "DCGM_FI_DRIVER_VERSION": "575.57.08", "machine_id": "55891"}
    (ok,) = s.take_events()
    assert ok["kind"] == "gpu_state" and ok["state"] == "ok" and ok["gpu_count"] == 1 and ok["driver"] == "575.57.08"


def test_an_unsupported_call_is_probed_once_per_gpu_and_never_again(sampler):
    pro = fake_pynvml.rtx_4090(1, name="NVIDIA RTX PRO 4000 Blackwell", power_mw=131_870, ecc_sbe=3, unsupported=frozenset({"nvmlDeviceGetRemappedRows"}))
    nv = fake_pynvml.FakeNvml([fake_pynvml.rtx_4090(), pro])
    s = sampler(nv)
    wait_until(lambda: s.samples_total >= 6, what="six samples")
    s.stop()
    utilization = nv.calls_of("nvmlDeviceGetUtilizationRates", 0)
    assert utilization >= 6
    assert nv.calls_of("nvmlDeviceGetRemappedRows", 0) == 1 and nv.calls_of("nvmlDeviceGetRemappedRows", 1) == 1
    assert nv.calls_of("nvmlDeviceGetTotalEccErrors", 0) == 2  # the SBE probe and the DBE probe, once each
    assert nv.calls_of("nvmlDeviceGetTotalEccErrors", 1) == 2 * nv.calls_of("nvmlDeviceGetUtilizationRates", 1)  # the PRO has ECC
    by_gpu = {x.gpu: x for x in s.latest()}
    assert "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL" not in by_gpu[0].values and by_gpu[1].values["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"] == 3.0
    assert by_gpu[1].values["DCGM_FI_DEV_POWER_USAGE"] == 131.87
    (ok,) = s.take_events()
    assert ok["unsupported"] == {
        "0": ["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"],
        "1": ["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"],
    }
    assert nv.shutdowns == 1 and not nv.event_sets  # NVML and the event set closed


def test_gpu_is_lost_on_a_call_reports_ok_then_gpu_lost_once_and_stops_asking(sampler):
    nv = fake_pynvml.FakeNvml([fake_pynvml.rtx_4090(lost_after_samples=3, xid_when_lost=False)])
    s = sampler(nv)
    wait_until(lambda: s.state(0) == "gpu_lost", what="the GPU lost")
    wait_until(lambda: s.samples_total >= 8, what="more samples")
    events = s.take_events()
    assert states(events) == [("ok", None), ("gpu_lost", 0)]
    assert events[1]["reason"] == "utilization: GPU is lost (NVML error 15)" and events[1]["UUID"] == UUID
    assert events[0]["ts"] < events[1]["ts"]
    assert nv.calls_of("nvmlDeviceGetUtilizationRates", 0) == 4  # 3 answered, the 4th lost it: no 5th
    assert nv.calls_of("nvmlDeviceGetMemoryInfo", 0) == 3
    (last,) = s.latest()
    assert last.seq == 3 and last.values["DCGM_FI_DEV_GPU_UTIL"] == 97.0  # no made-up sample after the loss


def test_xid_79_reports_gpu_lost_and_the_last_xid_is_a_gauge(sampler):
    nv = fake_pynvml.FakeNvml([fake_pynvml.rtx_4090()])
    s = sampler(nv)
    wait_until(lambda: s.state() == "ok", what="ok")
    nv.inject_xid(0, 13)  # "Graphics Engine Exception": recorded, the GPU is not lost
    wait_until(lambda: [x for x in s.latest() if x.values.get("DCGM_FI_DEV_XID_ERRORS") == 13.0], what="Xid 13 in a sample")
    assert s.state(0) is None
    nv.inject_xid(0, 79)
    wait_until(lambda: s.state(0) == "gpu_lost", what="the GPU lost")
    (sample,) = wait_until(lambda: [x for x in s.latest() if x.values.get("DCGM_FI_DEV_XID_ERRORS") == 79.0], what="Xid 79")
    assert sample.values == {"DCGM_FI_DEV_XID_ERRORS": 79.0}  # a lost GPU is not asked again
    events = s.take_events()
    assert states(events) == [("ok", None), ("gpu_lost", 0)]
    assert events[1]["reason"] == "Xid 79: GPU has fallen off the bus"


def test_nvml_unavailable_when_nvml_init_fails_or_the_library_is_missing(sampler):
    nv = fake_pynvml.FakeNvml([fake_pynvml.rtx_4090()], init_error=fake_pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    s = sampler(nv)
    wait_until(lambda: s.state() == "nvml_unavailable", what="nvml_unavailable")
    (event,) = s.take_events()
    assert event["reason"] == "nvmlInit: Driver Not Loaded (NVML error 9)"
    assert nv.calls_of("nvmlDeviceGetCount") == 0
    with pytest.raises(NvmlUnavailable, match="cannot import no_such_nvml_module"):
        load_nvml("no_such_nvml_module")
    missing = sampler(None, unavailable="cannot import pynvml")
    wait_until(lambda: missing.state() == "nvml_unavailable", what="nvml_unavailable")
    assert missing.take_events()[0]["reason"] == "cannot import pynvml"


def test_a_failing_sample_is_counted_and_sampling_goes_on(sampler):
    class Flaky(fake_pynvml.FakeNvml):
        def nvmlDeviceGetTemperature(self, h, sensor):
            if self.calls_of("nvmlDeviceGetTemperature", h.index) < 2:
                self.calls[("nvmlDeviceGetTemperature", h.index)] += 1
                raise fake_pynvml.NVMLError(fake_pynvml.NVML_ERROR_UNKNOWN)  # transient: skipped, asked again
            return super().nvmlDeviceGetTemperature(h, sensor)

        def nvmlDeviceGetPcieReplayCounter(self, h):
            if self.calls_of("nvmlDeviceGetPcieReplayCounter", h.index) < 1:
                self.calls[("nvmlDeviceGetPcieReplayCounter", h.index)] += 1
                raise RuntimeError("a bug")  # not NVML's: the sample is lost, counted, and the next one comes
            return super().nvmlDeviceGetPcieReplayCounter(h)

    s = sampler(Flaky([fake_pynvml.rtx_4090()]))
    wait_until(lambda: [x for x in s.latest() if x.values.get("DCGM_FI_DEV_GPU_TEMP") == 81.0], what="the temperature back")
    assert s.errors() == {"nvml_call": 2, "exception": 1}


def test_without_xid_events_sampling_goes_on(sampler):
    class NoEvents(fake_pynvml.FakeNvml):
        def nvmlEventSetCreate(self):
            raise fake_pynvml.NVMLError_NotSupported()  # as in some containers

    nv = NoEvents([fake_pynvml.rtx_4090()])
    s = sampler(nv)
    wait_until(lambda: s.samples_total >= 3, what="samples")
    assert s.state() == "ok" and s.errors() == {} and nv.calls_of("nvmlEventSetWait_v2") == 0


def test_a_wedged_nvml_call_does_not_hold_up_the_end():
    nv = fake_pynvml.FakeNvml([fake_pynvml.rtx_4090(hang_on="nvmlDeviceGetPowerUsage")])
    telemetry = GpuTelemetry.start(nvml_spec=None, nv=nv, instance_id="C.1", interval_s=0.05, timeout_s=0.5,
                                   endpoint="http://127.0.0.1:9/v1/metrics")
    try:
        wait_until(lambda: nv.calls_of("nvmlDeviceGetPowerUsage", 0) == 1, what="the stuck call")
        started = time.monotonic()
        telemetry.close_blocking()
        assert time.monotonic() - started < 3
        assert telemetry.sampler.state() is None and nv.shutdowns == 0  # NVML is left to the stuck thread
    finally:
        if nv is not None:
            nv.release()
        telemetry.sampler._threads[0].join(5)


# ---- settings ----------------------------------------------------------------------------------


def test_gpu_settings_from_flags_and_environment():
    inv = load(["run", *BASE, "--", "true"], {})
    assert (inv.settings.gpu_interval_s, inv.settings.otlp_endpoint, inv.settings.otlp_timeout_s) == (5.0, None, 10.0)
    inv = load(["tail", *BASE, "--tail", "cuzk=/a.log", "--gpu-interval", "0", "--otlp-endpoint", "http://otel:4318/v1/metrics"],
               {"FLEETLOG_MACHINE_ID": "55891", "FLEETLOG_AGENT_NVML_MODULE": "fake_pynvml:rtx4090"})
    assert inv.settings.gpu_interval_s == 0 and inv.settings.machine_id == 55891
    assert inv.settings.otlp_endpoint == "http://otel:4318/v1/metrics" and inv.settings.nvml_module == "fake_pynvml:rtx4090"
    with pytest.raises(ConfigError, match="--gpu-interval-s: expected 0 \\(off\\) or at least 0.05"):
        load(["run", *BASE, "--gpu-interval", "0.001", "--", "true"], {})
    with pytest.raises(ConfigError, match="FLEETLOG_AGENT_OTLP_TIMEOUT_S: expected float"):
        load(["run", *BASE, "--", "true"], {"FLEETLOG_AGENT_OTLP_TIMEOUT_S": "soon"})
    with pytest.raises(ConfigError, match="--otlp-endpoint: expected an http"):
        load(["run", *BASE, "--otlp-endpoint", "otel:4318", "--", "true"], {})


def test_the_token_goes_only_to_the_fleetlog_server():
    assert same_origin("http://10.0.0.2:8080/v1/metrics", "http://10.0.0.2:8080")
    assert same_origin("https://fleet.example/v1/metrics", "https://fleet.example:443/")
    assert not same_origin("http://10.0.0.2:4318/v1/metrics", "http://10.0.0.2:8080")
    assert not same_origin("https://10.0.0.2:8080/v1/metrics", "http://10.0.0.2:8080")


# ---- the real agent against the real server ----------------------------------------------------


def metrics_rows(api: Api, instance_id: str, name: str) -> list[tuple[float, dict]]:
    rows = api.query(f"SELECT value, labels FROM metrics WHERE instance_id = '{instance_id}' AND name = '{name}' ORDER BY ts")
    return [(value, json.loads(labels)) for value, labels in rows]


def scrape(url: str, token: str) -> dict[str, list]:
    req = urllib.request.Request(url + "/metrics", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        text = resp.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text) if f.name.startswith("DCGM_FI_")}


def gpu_states(api: Api, instance_id: str) -> list[tuple]:
    return [(e["state"], e.get("gpu")) for e in api.events(instance_id, "gpu_state")]


def waiting_benchmark(tmp_path: Path) -> tuple[Path, Path]:
    """A benchmark that runs until the test says, then fails the way a lost GPU makes it fail."""
    go = tmp_path / "go"
    script = tmp_path / "bench_until.sh"
    script.write_text(
        "#!/bin/sh\n"
        'echo "Starting benchmark: 12 proofs, concurrency 3, partition-workers 16"\n'
        f'while [ ! -e "{go}" ]; do sleep 0.05; done\n'
        'echo "cuzk-bench: rpc error: daemon closed the connection" >&2\n'
        'echo "benchmark.sh exited with error" >&2\n'
        "exit 1\n"
    )
    script.chmod(0o755)
    return script, go


def test_run_on_a_4090_that_falls_off_the_bus_stores_samples_states_and_every_line(tmp_path, server_process, agent):
    server = server_process("--enroll-token", "fleet-enroll", "--read-token", "fleet-read", "--admin-token", "fleet-admin",
                            "--policy-interval", "0").start()
    api = Api(server.url, token="fleet-read")
    script, go = waiting_benchmark(tmp_path)
    proc = agent(
        "run", server.url, "C.32733029", "--enroll-token", "fleet-enroll", "--token-file", str(tmp_path / "token"),
        "--machine-id", "55891", "--gpu-interval", "0.2", "--nvml-module", f"{FAKE}:rtx4090_lost",
        command=[script],
    ).start()
    # the fake answers 3 samples, then GPU_IS_LOST, with an Xid 79 event
    wait_until(lambda: gpu_states(api, "C.32733029") == [("ok", None), ("gpu_lost", 0)], what="ok, then gpu_lost")
    wait_until(lambda: metrics_rows(api, "C.32733029", "DCGM_FI_DEV_XID_ERRORS"), what="the Xid gauge")
    live = scrape(server.url, "fleet-read")  # while the instance lives: Prometheus gauges
    (util,) = live["DCGM_FI_DEV_GPU_UTIL"]
    assert util.value == 97.0 and util.labels["gpu"] == "0" and util.labels["UUID"] == UUID
    assert util.labels["instance_id"] == "C.32733029" and util.labels["machine_id"] == "55891"
    assert util.labels["modelName"] == "NVIDIA GeForce RTX 4090" and util.labels["DCGM_FI_DRIVER_VERSION"] == "575.57.08"
    assert [s.value for s in live["DCGM_FI_DEV_XID_ERRORS"]] == [79.0]
    assert [s.value for s in live["DCGM_FI_DEV_FB_USED"]] == [24064.0] and [s.value for s in live["DCGM_FI_DEV_POWER_USAGE"]] == [285.412]
    go.touch()
    assert proc.wait(timeout=60) == 1
    # the metrics table: each sample once, with DCGM-exporter labels
    util_rows = metrics_rows(api, "C.32733029", "DCGM_FI_DEV_GPU_UTIL")
    assert 1 <= len(util_rows) <= 3 and {v for v, _ in util_rows} == {97.0}
    assert util_rows[0][1] == {"gpu": "0", "UUID": UUID, "device": "nvidia0", "modelName": "NVIDIA GeForce RTX 4090",
                               "pci_bus_id": "00000000:01:00.0", "DCGM_FI_DRIVER_VERSION": "575.57.08", "machine_id": "55891"}
    for name, value in (("DCGM_FI_DEV_FB_FREE", 512.0), ("DCGM_FI_DEV_GPU_TEMP", 81.0), ("DCGM_FI_DEV_SM_CLOCK", 2520.0)):
        assert {v for v, _ in metrics_rows(api, "C.32733029", name)} == {value}, name
    assert metrics_rows(api, "C.32733029", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL") == []  # not supported on a 4090
    assert {v for v, _ in metrics_rows(api, "C.32733029", "DCGM_FI_DEV_XID_ERRORS")} == {79.0}
    # the states are events, in the spool's order, before bench_done; every line arrived
    kinds = [e["kind"] for e in api.instance("C.32733029")["events"]]
    assert kinds == ["registered", "bench_started", "gpu_state", "gpu_state", "bench_done", "logs_complete"]
    lost = api.events("C.32733029", "gpu_state")[1]
    assert lost["reason"] in ("utilization: GPU is lost (NVML error 15)", "Xid 79: GPU has fallen off the bus")
    assert_exactly_once(api, "C.32733029", "benchout", ["Starting benchmark: 12 proofs, concurrency 3, partition-workers 16",
                                                        "cuzk-bench: rpc error: daemon closed the connection", "benchmark.sh exited with error"])
    # what the GPU did in the last minute before the failed benchmark: one of the queries
    sql = (REPO / "queries" / "gpu_before_failure.sql").read_text()
    rows = {r[4]: r for r in api.query(sql) if r[0] == "C.32733029"}
    assert rows["DCGM_FI_DEV_GPU_UTIL"][-2] == 97.0 and rows["DCGM_FI_DEV_XID_ERRORS"][-2] == 79.0


def test_tail_without_a_driver_reports_nvml_unavailable_and_ships_the_logs(tmp_path, server_process, agent):
    server = server_process("--policy-interval", "0").start()
    api = Api(server.url)
    log = tmp_path / "cuzk.log"
    log.write_text("cuzk-daemon listening on 127.0.0.1:9820\n")
    proc = agent("tail", server.url, "C.7", "--tail", f"cuzk={log}", "--gpu-interval", "0.1",
                 "--nvml-module", f"{FAKE}:no_driver").start()
    wait_until(lambda: gpu_states(api, "C.7") == [("nvml_unavailable", None)], what="nvml_unavailable")
    assert api.events("C.7", "gpu_state")[0]["reason"] == "nvmlInit: Driver Not Loaded (NVML error 9)"
    with log.open("a") as f:
        f.write("proof 1 done in 138.2 s\n")
    wait_until(lambda: api.count("C.7", "cuzk") == 2, what="both lines")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert_exactly_once(api, "C.7", "cuzk", ["cuzk-daemon listening on 127.0.0.1:9820", "proof 1 done in 138.2 s"])
    assert api.events("C.7", "logs_complete")
    # no GPU metric; the host's memory is read all the same (test_agent_hostmem.py)
    assert api.query("SELECT count(*) FROM metrics WHERE instance_id = 'C.7' AND name NOT LIKE 'fleetlog_host_%' AND name NOT LIKE 'fleetlog_cgroup_%'") == [[0]]


def test_a_wedged_nvml_neither_stops_nor_delays_the_benchmarks_report(tmp_path, server_process, agent):
    server = server_process("--policy-interval", "0").start()
    api = Api(server.url)
    started = time.monotonic()
    done = agent("run", server.url, "C.8", "--gpu-interval", "0.1", "--otlp-timeout", "1", "--nvml-module", f"{FAKE}:wedged",
                 command=["sh", "-c", "echo 'Throughput: 42.5 proofs/hour'"]).run()
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 20
    assert api.instance("C.8")["bench"]["rate_per_hour"] == 42.5
    assert "GPU threads still busy" in done.stderr
    assert gpu_states(api, "C.8") == []  # stuck in its first sample: no state to report


# ---- the real NVML -----------------------------------------------------------------------------


@pytest.mark.gpu
def test_real_nvml_samples_are_sane():
    try:
        import pynvml
    except ImportError:
        pytest.skip("nvidia-ml-py is not installed")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        pytest.skip(f"no NVML here: {e}")
    pynvml.nvmlShutdown()
    nvml = Nvml(pynvml)
    nvml.open()
    try:
        assert nvml.devices and nvml.driver
        for device in nvml.devices:
            values = device.sample(pynvml)
            assert 0 <= values["DCGM_FI_DEV_GPU_UTIL"] <= 100 and 0 <= values["DCGM_FI_DEV_MEM_COPY_UTIL"] <= 100
            memory = pynvml.nvmlDeviceGetMemoryInfo(device.handle)
            assert 0 <= memory.used <= memory.total
            assert 0 <= values["DCGM_FI_DEV_FB_USED"] <= (memory.total / 2**20) + 1 and values["DCGM_FI_DEV_FB_FREE"] >= 0
            assert 0 <= values["DCGM_FI_DEV_GPU_TEMP"] <= 120
            if "DCGM_FI_DEV_POWER_USAGE" in values:
                assert 0 < values["DCGM_FI_DEV_POWER_USAGE"] < 2000
            assert device.uuid.startswith(("GPU-", "MIG-")) and device.name and ":" in device.pci_bus_id
            again = device.sample(pynvml)  # an unsupported call is not asked a second time
            assert set(again) <= set(values) | {"DCGM_FI_DEV_XID_ERRORS"}
    finally:
        nvml.close()
