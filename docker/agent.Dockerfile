# The GPU instance's image: a CUDA runtime with Python and the fleetlog agent only (no DuckDB, no
# server), and the entrypoint that runs the instance's whole lifecycle through the agent.
# Build from the repository root (`make images` does, with a version and the host's CA bundle):
#   docker build -f docker/agent.Dockerfile --build-arg FLEETLOG_IMAGE_VERSION=0.1.0 -t fleetlog-agent .
# BASE: any Debian or Ubuntu image; python3.11 is installed when the base lacks it.
# The proving stack (benchmark.sh, cuzk-daemon, cuzk-bench, curio, parameter fetch) is added by an
# image built FROM this one.
ARG BASE=nvidia/cuda:12.4.1-runtime-ubuntu22.04
FROM ${BASE}

RUN if ! python3.11 -c 'import ensurepip, venv' 2>/dev/null; then \
        apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
            python3.11 python3.11-venv ca-certificates \
        && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt /var/log/dpkg.log; \
    fi \
    && python3.11 -m venv /opt/fleetlog-agent

WORKDIR /opt/fleetlog
# The dependencies first, pyproject's extra 'agent' (no DuckDB, no pyarrow): a layer kept while only
# the code changes. A host that intercepts TLS passes its CA bundle as the build secret 'ca'; it is
# mounted for the one command, never stored in a layer.
COPY pyproject.toml README.md ./
RUN --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
    && mkdir -p agent ingest/web && touch agent/__init__.py ingest/__init__.py ingest/web/__init__.py \
    && /opt/fleetlog-agent/bin/pip install --no-cache-dir --disable-pip-version-check --quiet ".[agent]" \
    && /opt/fleetlog-agent/bin/pip uninstall --quiet --yes fleetlog \
    && rm -rf agent ingest build ./*.egg-info
# Then the agent's code, --no-deps; the server's package (ingest) is not in the image.
COPY agent ./agent
RUN --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
    && mkdir -p ingest/web && touch ingest/__init__.py ingest/web/__init__.py \
    && /opt/fleetlog-agent/bin/pip install --no-cache-dir --disable-pip-version-check --quiet --no-deps . \
    && rm -rf /opt/fleetlog-agent/lib/python3.11/site-packages/ingest /opt/fleetlog-agent/bin/fleetlog \
    && cd / && rm -rf /opt/fleetlog && /opt/fleetlog-agent/bin/fleetlog-agent --help >/dev/null
WORKDIR /
COPY docker/entrypoint.sh /usr/local/bin/fleetlog-entrypoint.sh
# The version last: a new version rebuilds only these layers. It is the entrypoint's labels.image_version.
ARG FLEETLOG_IMAGE_VERSION=dev
LABEL org.opencontainers.image.title="fleetlog-agent" \
      org.opencontainers.image.version="${FLEETLOG_IMAGE_VERSION}"
ENV PATH=/opt/fleetlog-agent/bin:$PATH \
    FLEETLOG_AGENT_SPOOL=/var/tmp/fleetlog-agent \
    FLEETLOG_IMAGE_VERSION=${FLEETLOG_IMAGE_VERSION}
ENTRYPOINT ["/usr/local/bin/fleetlog-entrypoint.sh"]
