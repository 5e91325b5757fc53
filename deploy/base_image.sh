#!/usr/bin/env bash
# localhost/bookworm-min:latest, made from Debian's packages with debootstrap (no registry here)
set -euo pipefail
PODMAN=(podman --runtime runc --cgroup-manager cgroupfs)
if "${PODMAN[@]}" image exists localhost/bookworm-min:latest; then exit 0; fi
ROOTFS=$(mktemp -d /var/tmp/bookworm-min.XXXX)
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
debootstrap --variant=minbase bookworm "$ROOTFS" "$MIRROR" >/dev/null
tar -C "$ROOTFS" -c . | "${PODMAN[@]}" import - localhost/bookworm-min:latest >/dev/null
rm -rf "$ROOTFS"
