"""/metrics stays valid and bounded whatever was pushed: GPU label names follow Prometheus's rules
(checked at the door, and dropped-and-counted at scrape time for what is already stored), GPU series
are capped per instance and in total, and ``promtool check metrics`` passes on the exposition."""

from __future__ import annotations

import datetime as dt
import subprocess

import orjson
from prometheus_client.parser import text_string_to_metric_families

from ingest.contract.codec import MetricRows
from ingest.timestamps import now_us
from tests.test_alerts import promtool

HOSTILE_KEYS = ["", "__name__", "a-b", "a b", "0gpu", "__meta", "gpu.uuid"]


def promtool_check(text: str) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)


def gpu_series(text: str) -> list:
    return [s for f in text_string_to_metric_families(text) if f.name.startswith("DCGM_FI_") for s in f.samples]


def sample(key: str, value: float = 1.0) -> dict:
    return {"name": "DCGM_FI_DEV_GPU_UTIL", "ts": dt.datetime.now(dt.timezone.utc).isoformat(), "value": value,
            "labels": {"gpu": "0", key: "v"}}


def stored(instance_id: str, labels: list[dict], name: str = "DCGM_FI_DEV_GPU_UTIL") -> MetricRows:
    """Rows as they may already sit in the database (written before the door checked them)."""
    rows = MetricRows()
    at = now_us()
    for i, point in enumerate(labels):
        rows.instance_id.append(instance_id)
        rows.name.append(name)
        rows.ts_us.append(at)
        rows.value.append(float(i))
        rows.labels.append(orjson.dumps(point).decode())
    return rows


async def test_metrics_pass_promtool_check_when_hostile_label_keys_were_pushed(client):
    for key in HOSTILE_KEYS:
        r = await client.post("/api/v1/metrics", data=orjson.dumps({"instance_id": "C.1", "samples": [sample(key)]}))
        assert r.status == 400 and "samples[0].labels" in (await r.json())["error"], key
    # what may already be stored (written before the door checked it): refused names and labels, and
    # two label sets that render the same once translated
    await client.writer.submit(metrics=stored("C.2", [{"gpu": "0", key: "v"} for key in HOSTILE_KEYS]
                                              + [{"gpu": "0", "a_b": "v"}, {"gpu": "1", "x": "y" * 2000}]), kind="metrics")
    await client.writer.submit(metrics=stored("C.3", [{"gpu": "0"}], name="DCGM_FI_X Y"), kind="metrics")
    await client.writer.submit(metrics=stored("C.3", [{"gpu": "0"}], name="DCGM_FI_é"), kind="metrics")
    await client.writer.flush()
    r = await client.get("/metrics")
    assert r.status == 200
    text = await r.text()
    checked = promtool_check(text)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    series = gpu_series(text)
    assert sorted(s.labels.get("gpu_uuid", s.labels.get("a_b")) for s in series) == ["v", "v"]
    assert dropped(text) == {"instance_cap": 0, "total_cap": 0, "metric_name": 2, "label_name": 4, "label_size": 1,
                             "duplicate": 2}


async def test_label_values_and_otlp_names_reach_the_gpu_gauges_escaped(client):
    hostile = 'a"b\\c\nd}'
    r = await client.post("/api/v1/metrics", data=orjson.dumps({"instance_id": "C.1", "samples": [
        {"name": "DCGM_FI_DEV_GPU_TEMP", "value": 81, "labels": {"gpu": "0", "modelName": hostile}}]}))
    assert r.status == 200

    def point(keys: dict[str, str]) -> dict:
        return {"asDouble": 97.0, "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in keys.items()]}

    otlp = orjson.dumps({"resourceMetrics": [{
        "resource": {"attributes": [{"key": "service.instance.id", "value": {"stringValue": "C.2"}}]},
        "scopeMetrics": [{"metrics": [
            {"name": "DCGM_FI_DEV_GPU_UTIL", "gauge": {"dataPoints": [point({"gpu": "0", "gpu.uuid": hostile}),
                                                                      point({"": "x"}), point({"__name__": "x"})]}},
            {"name": "DCGM_FI_DEV GPU", "gauge": {"dataPoints": [point({"gpu": "0"})]}}]}]}]})
    r = await client.post("/v1/metrics", data=otlp, headers={"Content-Type": "application/json"})
    reply = await r.json()
    assert r.status == 200 and int(reply["partialSuccess"]["rejectedDataPoints"]) == 3, reply
    text = await (await client.get("/metrics")).text()
    checked = promtool_check(text)
    assert checked.returncode in (0, 3) and "error" not in checked.stderr, checked.stderr  # 3: lint (modelName)
    values = {(s.name, s.labels["instance_id"]): s.labels for s in gpu_series(text)}
    assert values[("DCGM_FI_DEV_GPU_TEMP", "C.1")]["modelName"] == hostile
    assert values[("DCGM_FI_DEV_GPU_UTIL", "C.2")]["gpu_uuid"] == hostile
    assert len(values) == 2


def dropped(text: str) -> dict[str, float]:
    return {s.labels["reason"]: s.value for f in text_string_to_metric_families(text)
            if f.name == "fleetlog_gpu_series_dropped" for s in f.samples if s.name.endswith("_total")}


async def test_gpu_series_stay_under_the_caps_when_distinct_uuids_flood(make_client):
    client = await make_client(gpu_gauge_max_series=800, gpu_gauge_max_series_per_instance=500)
    before = await (await client.get("/metrics")).text()
    assert set(dropped(before).values()) == {0}  # the series exist at 0 from start-up
    now = dt.datetime.now(dt.timezone.utc).isoformat()
    for instance_id, n in (("C.1", 20_000), ("C.2", 300), ("C.3", 300)):
        for start in range(0, n, 5_000):  # pushes of at most 5,000 samples, as an agent would send them
            samples = [{"name": "DCGM_FI_DEV_GPU_UTIL", "ts": now, "value": 1, "labels": {"gpu": "0", "UUID": f"GPU-{i}"}}
                       for i in range(start, min(n, start + 5_000))]
            r = await client.post("/api/v1/metrics", data=orjson.dumps({"instance_id": instance_id, "samples": samples}))
            assert r.status == 200
    text = await (await client.get("/metrics")).text()
    series = gpu_series(text)
    assert len(series) == 800
    per_instance = {i: sum(1 for s in series if s.labels["instance_id"] == i) for i in ("C.1", "C.2", "C.3")}
    assert max(per_instance.values()) <= 500 and min(per_instance.values()) >= 266  # the total is shared round-robin
    counts = dropped(text)
    assert counts["instance_cap"] == 20_000 - 500 and counts["total_cap"] == 500 + 300 + 300 - 800
    checked = promtool_check(text)
    assert checked.returncode == 0, checked.stdout + checked.stderr
