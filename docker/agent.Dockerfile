# The GPU instance's image: a CUDA runtime with Python and the fleetlog agent only (no DuckDB, no
# server), and the entrypoint that runs the instance's whole lifecycle through the agent.
# Build from the repository root:  docker build -f docker/agent.Dockerfile -t fleetlog-agent .
# The proving stack (benchmark.sh, cuzk-daemon, cuzk-bench, curio, parameter fetch) is added by an
# image built FROM this one.
FROM nvidia/cuda:12.4.1-runtime-ubuntu22.04

RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3.11 python3.11-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3.11 -m venv /opt/fleetlog-agent

WORKDIR /opt/fleetlog
COPY pyproject.toml README.md ./
COPY agent ./agent
COPY ingest ./ingest
# --no-deps: the distribution also carries the server; the agent needs only these.
RUN /opt/fleetlog-agent/bin/pip install --no-cache-dir aiohttp orjson nvidia-ml-py opentelemetry-sdk \
        opentelemetry-exporter-otlp-proto-http \
    && /opt/fleetlog-agent/bin/pip install --no-cache-dir --no-deps . \
    && rm -rf /opt/fleetlog/ingest
ENV PATH=/opt/fleetlog-agent/bin:$PATH \
    FLEETLOG_AGENT_SPOOL=/var/tmp/fleetlog-agent
COPY docker/entrypoint.sh /usr/local/bin/fleetlog-entrypoint.sh
ENTRYPOINT ["/usr/local/bin/fleetlog-entrypoint.sh"]
