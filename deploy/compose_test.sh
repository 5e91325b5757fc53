#!/usr/bin/env bash
# make compose-test: the Docker Compose deployment under podman-compose (deploy/compose_test.py).
# Needs root, podman, runc and debootstrap (Debian: apt-get install -y podman runc debootstrap) and
# podman-compose (PyPI: installed into .venv here when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
for tool in podman runc debootstrap; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
if ((${#missing[@]})); then
  echo "make compose-test needs ${missing[*]}: on Debian, apt-get install -y podman runc debootstrap" >&2
  exit 2
fi
test -x .venv/bin/podman-compose || .venv/bin/uv pip install --python .venv/bin/python -q podman-compose==1.6.0
TAG=${TAG:-test}
podman --runtime runc --cgroup-manager cgroupfs image exists "localhost/llm-stream-executor:$TAG" \
  && podman --runtime runc --cgroup-manager cgroupfs image exists "localhost/llm-stream-gateway:$TAG" \
  || bash deploy/build_images.sh "$TAG"
.venv/bin/python deploy/compose_test.py --tag "$TAG"
