# The fleetlog server: ingest API, DuckDB, policies, the page. Build from the repository root:
#   docker build -f docker/ingest.Dockerfile -t fleetlog-ingest .
FROM python:3.11-slim

WORKDIR /opt/fleetlog
COPY pyproject.toml README.md ./
COPY ingest ./ingest
COPY agent ./agent
COPY queries ./queries
RUN pip install --no-cache-dir . && useradd --system --home /var/lib/fleetlog fleetlog \
    && mkdir -p /var/lib/fleetlog && chown fleetlog /var/lib/fleetlog

USER fleetlog
# Bind all interfaces inside the container; the server refuses to start that way without tokens
# (FLEETLOG_ENROLL_TOKEN, FLEETLOG_READ_TOKEN, FLEETLOG_ADMIN_TOKEN) unless FLEETLOG_ALLOW_OPEN_BIND=true.
ENV FLEETLOG_HOST=0.0.0.0 \
    FLEETLOG_PORT=8080 \
    FLEETLOG_DB=/var/lib/fleetlog/fleetlog.duckdb \
    FLEETLOG_QUERIES_DIR=/opt/fleetlog/queries
VOLUME /var/lib/fleetlog
EXPOSE 8080 4317
HEALTHCHECK --interval=15s --timeout=3s CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/readyz', timeout=2)"
ENTRYPOINT ["fleetlog", "serve"]
