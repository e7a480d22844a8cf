# The fleetlog server: ingest API, DuckDB, policies, the page. Build from the repository root
# (`make images` does, with a version and the host's CA bundle; podman needs --format docker to keep
# the HEALTHCHECK):
#   docker build -f docker/ingest.Dockerfile --build-arg FLEETLOG_IMAGE_VERSION=0.1.0 -t fleetlog-ingest .
# BASE: any Debian or Ubuntu image; python3.11 is installed when the base lacks it.
# EXTRA: pyproject's extra to install, `server` (the single file) or `lake` (adds what
# `fleetlog serve --lake` needs: the DuckLake and postgres extension packages, psycopg, pytz; about
# 90 MB more, docs/scale-out.md):
#   docker build -f docker/ingest.Dockerfile --build-arg EXTRA=lake -t fleetlog-ingest-lake .
ARG BASE=python:3.11-slim
ARG EXTRA=server
FROM ${BASE} AS python
RUN if ! python3.11 -c 'import ensurepip, venv' 2>/dev/null; then \
        apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
            python3.11 python3.11-venv \
        && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt /var/log/dpkg.log; \
    fi

# The virtual environment is built here; the image gets it without pip and without the parts of
# pyarrow the server never loads (Flight, S3, tests, headers).
FROM python AS build
ARG EXTRA
RUN python3.11 -m venv /opt/fleetlog-venv
WORKDIR /opt/fleetlog
# The dependencies first, pyproject's extra (EXTRA): a layer kept while only the code changes. A host
# that intercepts TLS passes its CA bundle as the build secret 'ca'; it is never stored in a layer.
COPY pyproject.toml README.md ./
RUN --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
    && mkdir -p agent ingest/web && touch agent/__init__.py ingest/__init__.py ingest/web/__init__.py \
    && /opt/fleetlog-venv/bin/pip install --no-cache-dir --disable-pip-version-check --quiet ".[${EXTRA}]" \
    && /opt/fleetlog-venv/bin/pip uninstall --quiet --yes fleetlog \
    && rm -rf agent ingest build ./*.egg-info
COPY ingest ./ingest
COPY agent ./agent
COPY queries ./queries
RUN --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
    && /opt/fleetlog-venv/bin/pip install --no-cache-dir --disable-pip-version-check --quiet --no-deps . \
    && /opt/fleetlog-venv/bin/pip uninstall --quiet --yes pip setuptools \
    && cd /opt/fleetlog-venv/lib/python3.11/site-packages/pyarrow \
    && rm -rf tests include _flight.* libarrow_flight.* libarrow_python_flight.* _s3fs.* libarrow_s3.* _pyarrow_cpp_tests.* \
    && cd / && /opt/fleetlog-venv/bin/python -c "import duckdb, pyarrow, grpc, ingest.app" \
    && if [ "$EXTRA" = lake ]; then /opt/fleetlog-venv/bin/python -c "import ingest.db.lake.storage, ingest.db.lake.slots; ingest.db.lake.storage._extension_files()" \
        && rm -rf /tmp/fleetlog-duckdb-extensions-*; fi

FROM python
RUN useradd --system --home /var/lib/fleetlog fleetlog \
    && mkdir -p /var/lib/fleetlog && chown fleetlog /var/lib/fleetlog
COPY --from=build /opt/fleetlog-venv /opt/fleetlog-venv
COPY queries /opt/fleetlog/queries
USER fleetlog
# Bind all interfaces inside the container; the server refuses to start that way without tokens
# (FLEETLOG_ENROLL_TOKEN, FLEETLOG_READ_TOKEN, FLEETLOG_ADMIN_TOKEN) unless FLEETLOG_ALLOW_OPEN_BIND=true.
ENV PATH=/opt/fleetlog-venv/bin:$PATH \
    FLEETLOG_HOST=0.0.0.0 \
    FLEETLOG_PORT=8080 \
    FLEETLOG_DB=/var/lib/fleetlog/fleetlog.duckdb \
    FLEETLOG_QUERIES_DIR=/opt/fleetlog/queries
VOLUME /var/lib/fleetlog
EXPOSE 8080 4317
HEALTHCHECK --interval=15s --timeout=3s CMD python3.11 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/readyz', timeout=2)"
ARG FLEETLOG_IMAGE_VERSION=dev
ARG EXTRA
LABEL org.opencontainers.image.title="fleetlog-ingest" \
      org.opencontainers.image.version="${FLEETLOG_IMAGE_VERSION}" \
      io.fleetlog.extra="${EXTRA}"
ENTRYPOINT ["fleetlog", "serve"]
