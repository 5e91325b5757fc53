#!/usr/bin/env bash
# Both CPU images (deploy/Dockerfile), built with podman from a base made of Debian's packages
# (deploy/base_image.sh): localhost/llm-stream-executor:TAG and localhost/llm-stream-gateway:TAG.
#   bash deploy/build_images.sh [TAG]      (make image-test and make compose-test run it)
set -euo pipefail
cd "$(dirname "$0")/.."
TAG=${1:-test}
PODMAN=(podman --runtime runc --cgroup-manager cgroupfs)
LIMITS=(--ulimit nofile=4096:4096 --ulimit nproc=4096:4096)
CA=/etc/ssl/certs/ca-certificates.crt
bash deploy/base_image.sh
# the CPU torch wheel this machine has (pip's find-links), as the image's torch
FIND_LINKS=$(.venv/bin/python -m pip config get global.find-links 2>/dev/null || true)
for dir in $FIND_LINKS; do cp -n "$dir"/torch-2.13.0*-cp311-*.whl deploy/wheels/ 2>/dev/null || true; done

build() {  # target
  local started=$SECONDS
  "${PODMAN[@]}" build --format docker --network host "${LIMITS[@]}" -v "$CA:/run/host-ca.crt:ro" -f deploy/Dockerfile \
    --build-arg BASE=localhost/bookworm-min:latest --build-arg TORCH=cpu --build-arg TORCH_INDEX= \
    --target "$1" -t "localhost/llm-stream-$1:$TAG" . >"/tmp/llm-stream-build-$1.log" 2>&1 \
    || { tail -30 "/tmp/llm-stream-build-$1.log"; exit 1; }
  echo "built localhost/llm-stream-$1:$TAG in $((SECONDS - started)) s, $("${PODMAN[@]}" image inspect \
    "localhost/llm-stream-$1:$TAG" --format '{{.Size}}' | awk '{printf "%.0f MB", $1 / 1e6}')"
}
build executor
build gateway

