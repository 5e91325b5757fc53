#!/usr/bin/env bash
# make image-test: build both CPU images with podman, run the gateway and the executor as
# containers, stream a greedy answer over gRPC and over OpenAI SSE, check that it equals the
# answer of `make serve` (the same Flow, not in containers), and leave no container behind.
# Needs root, podman, runc and debootstrap (Debian: apt-get install -y podman runc debootstrap);
# no registry: the base image is made from Debian's packages (deploy/base_image.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
for tool in podman runc debootstrap; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
if ((${#missing[@]})); then
  echo "make image-test needs ${missing[*]}: on Debian, apt-get install -y podman runc debootstrap" >&2
  exit 2
fi
TAG=${TAG:-test}
PODMAN=(podman --runtime runc --cgroup-manager cgroupfs)
LIMITS=(--ulimit nofile=4096:4096 --ulimit nproc=4096:4096)
# podman schedules HEALTHCHECKs with systemd, which this machine lacks: they are run by hand below
RUN=(--health-interval disable --network host "${LIMITS[@]}")
CA=/etc/ssl/certs/ca-certificates.crt
EXECUTOR_PORT=23456 GRPC_PORT=23345 HTTP_PORT=23346

bash deploy/build_images.sh "$TAG"
# podman logs errors for the systemd timers of the images' HEALTHCHECKs, which this machine lacks (they are
# run by hand below) on every container start: a command's output is shown only when it fails
quiet() { local out; out=$("$@" 2>&1) || { echo "$out" >&2; return 1; }; }

cleanup() { "${PODMAN[@]}" rm -f llm-stream-executor llm-stream-gateway >/dev/null 2>&1 || true; }
trap cleanup EXIT
cleanup
quiet "${PODMAN[@]}" run -d --name llm-stream-executor "${RUN[@]}" -e LLM_HEALTH_PORT=$EXECUTOR_PORT \
  -v "$PWD/models:/models:ro" "localhost/llm-stream-executor:$TAG" --port $EXECUTOR_PORT --host 127.0.0.1 >/dev/null
quiet "${PODMAN[@]}" run -d --name llm-stream-gateway "${RUN[@]}" -e LLM_HEALTH_URL=http://127.0.0.1:$HTTP_PORT/ \
  "localhost/llm-stream-gateway:$TAG" \
  --port $GRPC_PORT $HTTP_PORT --protocol grpc http \
  --graph-description '{"llm": ["end-gateway"], "start-gateway": ["llm"]}' \
  --deployments-addresses "{\"llm\": [\"grpc://127.0.0.1:$EXECUTOR_PORT\"]}"
.venv/bin/python deploy/compare.py --containers $GRPC_PORT $HTTP_PORT \
  || { "${PODMAN[@]}" logs --tail 40 llm-stream-executor; "${PODMAN[@]}" logs --tail 40 llm-stream-gateway; exit 1; }
for name in llm-stream-executor llm-stream-gateway; do  # the images' HEALTHCHECKs, and who runs them
  # unhealthy after 3 failures in a row, as a runtime decides (HEALTHCHECK's --retries default)
  for try in 1 2 3; do
    if out=$("${PODMAN[@]}" healthcheck run "$name" 2>&1); then break; fi
    ((try < 3)) || { echo "$out" >&2; echo "$name: HEALTHCHECK failed 3 times in a row"; exit 1; }
  done
  echo "$name: healthy, running as uid $("${PODMAN[@]}" exec "$name" id -u)"
done
cleanup
test -z "$("${PODMAN[@]}" ps -a --filter name=llm-stream -q)" && echo "image-test passed; no container left"
