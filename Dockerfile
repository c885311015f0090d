# syntax=docker/dockerfile:1
# One image for every fanout role: `docker run IMAGE worker`, `docker run IMAGE publisher`.

# --- build stage: compilers live here only ---------------------------------------------
# The [otel] extra brings the OTLP (HTTP and gRPC) and Prometheus exporters, so the
# OTEL_*_EXPORTER variables work in the image without a rebuild.
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md fanout_cli.py openapi.json ./
COPY schema ./schema
COPY infra ./infra
COPY worker ./worker
COPY publisher ./publisher
COPY tools ./tools
COPY client ./client
RUN python -m venv /opt/fanout \
 && /opt/fanout/bin/pip install --upgrade pip \
 && /opt/fanout/bin/pip install ".[otel,fast]"

# --- final stage: the virtual environment and the transcripts, no build tools ----------
FROM python:3.11-slim
RUN groupadd --system --gid 10001 fanout \
 && useradd --system --uid 10001 --gid fanout --home-dir /app --shell /usr/sbin/nologin fanout
COPY --from=build /opt/fanout /opt/fanout
WORKDIR /app
COPY --chown=fanout:fanout transcripts ./transcripts
ENV PATH=/opt/fanout/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    FANOUT_TRANSCRIPTS_DIR=/app/transcripts
USER fanout
# 8080: the publisher's HTTP port; 9464: the Prometheus scrape endpoint when
# OTEL_METRICS_EXPORTER=prometheus (set OTEL_EXPORTER_PROMETHEUS_HOST=0.0.0.0 to reach it).
EXPOSE 8080 9464
# Liveness: Redis answers, and FANOUT_HEALTH_URL (set it for publishers) returns 200.
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 CMD ["fanout", "health"]
ENTRYPOINT ["fanout"]
CMD ["--help"]
