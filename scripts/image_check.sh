#!/usr/bin/env bash
# `make image-check`: build the repository's Dockerfile, unmodified, with buildah on a base
# assembled from Debian packages, and prove the image works: worker, publisher and
# `fanout upstream` containers (runtime runc, host network) against a private Redis, both
# health checks, the non-root user, and one stream end to end (stream.done over SSE).
#
# Needs root (buildah/podman with runc, mmdebstrap) and Debian's apt; installs
# buildah podman mmdebstrap runc when missing. Exit codes: 0 passed, 1 a check failed,
# 2 cannot run here (not root, no apt-get, a tool missing).
#
# Environment:
#   FANOUT_IMAGE_CACHE   directory of the cached base tarball (/var/cache/fanout-image-check)
#   FANOUT_IMAGE_REBASE  1: rebuild the base even when localhost/python:3.11-slim exists
#   FANOUT_IMAGE_KEEP    1: keep the built image localhost/fanout:image-check afterwards
#   DEBIAN_MIRROR        mirror for mmdebstrap (http://deb.debian.org/debian)
set -euo pipefail
cd "$(dirname "$0")/.."

BASE=localhost/python:3.11-slim      # the name the Dockerfile's FROM resolves to
IMAGE=localhost/fanout:image-check
CACHE=${FANOUT_IMAGE_CACHE:-/var/cache/fanout-image-check}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# python3-venv and python3-pip for the build stage's venv; python-is-python3 because the
# Dockerfile calls `python`; ca-certificates for pip's HTTPS; apt, passwd (groupadd,
# useradd) and the compilers the build stage installs itself come with minbase / apt.
BASE_PACKAGES=python3,python3-venv,python3-pip,python-is-python3,ca-certificates
UID_EXPECTED=10001
STARTED=$SECONDS
# podman's default rlimits are above what this root (no CAP_SYS_RESOURCE in a sandbox) may
# set: keep the shell's open-files limit and a process limit well under the machine's.
RUN_OPTS=(--runtime runc --ulimit "nofile=$(ulimit -Sn):$(ulimit -Hn)" --ulimit nproc=4096:4096)

PASSED=0
say() { printf 'image-check: %s\n' "$*"; }
ok() { PASSED=$((PASSED + 1)); say "ok: $*"; }
fail() { say "FAILED: $*"; say "$PASSED passed, 1 failed"; exit 1; }
cannot() { say "cannot run here: $*"; exit 2; }
step() { say "$1 (${SECONDS}s)"; }

[ "$(id -u)" = 0 ] || cannot "needs root (buildah and podman run as root with runc)"

missing=()
for tool in buildah podman mmdebstrap runc; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  command -v apt-get >/dev/null 2>&1 || cannot "no apt-get to install ${missing[*]}"
  step "installing ${missing[*]} from Debian"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    buildah podman mmdebstrap runc >/dev/null
fi

WORK=$(mktemp -d /tmp/fanout-image-check.XXXXXX)
NAME=fanout-check-$$
REDIS_PID=""
cleanup() {
  podman rm -f -t 2 "$NAME-worker" "$NAME-publisher" "$NAME-upstream" >/dev/null 2>&1 || true
  if [ -n "$REDIS_PID" ]; then kill "$REDIS_PID" 2>/dev/null || true; wait "$REDIS_PID" 2>/dev/null || true; fi
  if [ "${FANOUT_IMAGE_KEEP:-0}" != 1 ]; then podman rmi -f "$IMAGE" >/dev/null 2>&1 || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM   # so that the EXIT trap cleans up on Ctrl-C and SIGTERM too

# --- base image: mmdebstrap of bookworm, cached as a tarball and as the tag -------------
if [ "${FANOUT_IMAGE_REBASE:-0}" != 1 ] && podman image exists "$BASE"; then
  step "base $BASE exists, reused"
else
  mkdir -p "$CACHE"
  tarball="$CACHE/bookworm-python3.tar"
  if [ "${FANOUT_IMAGE_REBASE:-0}" = 1 ] || [ ! -s "$tarball" ]; then
    step "mmdebstrap bookworm ($BASE_PACKAGES) from $MIRROR"
    mmdebstrap --quiet --variant=minbase --include="$BASE_PACKAGES" bookworm "$tarball.partial.tar" "$MIRROR"
    mv "$tarball.partial.tar" "$tarball"
  fi
  step "importing $tarball as $BASE"
  podman import --quiet --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' "$tarball" "$BASE" >/dev/null
fi
podman run --rm "${RUN_OPTS[@]}" --network none "$BASE" python3 -c \
  'import sys, venv, ensurepip; assert sys.version_info[:2] == (3, 11), sys.version' \
  || fail "$BASE has no Python 3.11 with venv"
ok "$BASE runs Python 3.11 with venv and ensurepip"

# --- build: the Dockerfile as it is; the host's pip trust settings are mounted ----------
# pip in the build stage reaches PyPI as this machine's pip does: the same CA bundle
# (mounted over the base's) and, when the host names one, the same index.
{
  echo "[global]"
  echo "cert = /etc/ssl/certs/ca-certificates.crt"
  echo "default-timeout = 180"
  index=${PIP_INDEX_URL:-$(pip config get global.index-url 2>/dev/null || true)}
  [ -n "$index" ] && echo "index-url = $index"
} > "$WORK/pip.conf"
volumes=(--volume "$WORK/pip.conf:/etc/pip.conf:ro")
[ -s /etc/ssl/certs/ca-certificates.crt ] \
  && volumes+=(--volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
step "buildah bud --pull=never (Dockerfile unmodified)"
buildah bud --quiet --pull=never --format docker --runtime runc --network host \
  "${volumes[@]}" -t "$IMAGE" -f Dockerfile . > "$WORK/build.log" 2>&1 \
  || { tail -40 "$WORK/build.log"; fail "the image did not build (log above)"; }
build_s=$SECONDS
ok "the Dockerfile built with --pull=never on $BASE"

# --- run: Redis, upstream, worker, publisher ---------------------------------------------
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
REDIS_PORT=$(free_port)
UP_PORT=$(free_port)
PUB_PORT=$(free_port)
REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
API_KEY="check-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
TOKEN_SECRET=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
step "redis-server on 127.0.0.1:$REDIS_PORT"
redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save "" --appendonly no --dir "$WORK" \
  --logfile "$WORK/redis.log" &
REDIS_PID=$!

run_container() {  # NAME-SUFFIX, then podman run arguments
  local suffix=$1; shift
  # No systemd here to schedule health checks (podman logs an error and goes on): the
  # checks below run them with `podman healthcheck run`.
  podman run -d --name "$NAME-$suffix" "${RUN_OPTS[@]}" --network host \
    -e REDIS_URL="$REDIS_URL" -e FANOUT_REDIS_PREFIX="imagecheck$$" "$@" >/dev/null 2>>"$WORK/podman.log" \
    || { cat "$WORK/podman.log"; fail "podman run $suffix"; }
}
step "containers: upstream :$UP_PORT, worker, publisher :$PUB_PORT"
run_container upstream "$IMAGE" upstream --host 127.0.0.1 --port "$UP_PORT"
run_container worker \
  -e FANOUT_ANTHROPIC_BASE_URL="http://127.0.0.1:$UP_PORT" -e ANTHROPIC_API_KEY=not-needed \
  "$IMAGE" worker --concurrency 4
run_container publisher \
  -e FANOUT_API_KEYS="$API_KEY" -e FANOUT_TOKEN_SECRET="$TOKEN_SECRET" \
  -e FANOUT_HEALTH_URL="http://127.0.0.1:$PUB_PORT/healthz" \
  "$IMAGE" publisher --host 127.0.0.1 --port "$PUB_PORT"

healthy() {  # the image's HEALTHCHECK (fanout health), run by podman
  local i
  for i in $(seq 1 30); do
    podman healthcheck run "$NAME-$1" >/dev/null 2>&1 && return 0
    sleep 1
  done
  podman logs --tail 20 "$NAME-$1" || true
  return 1
}
check=$(podman image inspect --format '{{json .HealthCheck.Test}}' "$IMAGE")
[ "$check" = '["CMD","fanout","health"]' ] || fail "the image's HEALTHCHECK is $check, not fanout health"
ok "the image's HEALTHCHECK runs fanout health"
for role in worker publisher; do
  healthy "$role" || fail "$role health check (fanout health) did not pass within 30 s"
  ok "$role: health check passed"
  uid=$(podman exec "$NAME-$role" id -u)
  [ "$uid" = "$UID_EXPECTED" ] || fail "$role runs as uid $uid, not $UID_EXPECTED"
  ok "$role: runs as uid $uid"
done

# --- one stream end to end ---------------------------------------------------------------
URL="http://127.0.0.1:$PUB_PORT"
step "submitting anthropic/thinking_with_signature"
curl -sS --fail-with-body --max-time 10 "$URL/v1/streams" -H "Authorization: Bearer $API_KEY" \
  -H 'Content-Type: application/json' \
  -d '{"provider": "anthropic", "model": "thinking_with_signature",
       "request": {"max_tokens": 1024, "messages": [{"role": "user", "content": "Hello"}]}}' \
  > "$WORK/submit.json" || fail "submit: $(cat "$WORK/submit.json")"
read -r STREAM_ID TOKEN < <(python3 -c \
  'import json, sys; s = json.load(open(sys.argv[1])); print(s["stream_id"], s["token"])' "$WORK/submit.json")
curl -sS -N --max-time 30 "$URL/v1/streams/$STREAM_ID/events" -H "Authorization: Bearer $TOKEN" \
  > "$WORK/events.sse" || true
events=$(grep -c '^event: ' "$WORK/events.sse" || true)
grep -q '^event: stream.done$' "$WORK/events.sse" || {
  tail -20 "$WORK/events.sse"; podman logs --tail 20 "$NAME-worker"; fail "no stream.done in the SSE response"; }
ok "stream $STREAM_ID: $events events over SSE, ending with $(grep '^event: ' "$WORK/events.sse" | tail -1)"

# The health check is not vacuous: without Redis it fails.
kill "$REDIS_PID"; wait "$REDIS_PID" 2>/dev/null || true; REDIS_PID=""
if podman healthcheck run "$NAME-worker" >/dev/null 2>&1; then fail "worker health check passes with Redis stopped"; fi
ok "worker: health check fails with Redis stopped"

say "took $((SECONDS - STARTED)) s (base and build $((build_s - STARTED)) s)"
say "$PASSED passed, 0 failed"
