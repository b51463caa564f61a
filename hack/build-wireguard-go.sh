#!/usr/bin/env bash
# Build a current userspace WireGuard (wireguard-go) from the Go module proxy, cached like the
# Kubernetes binaries (hack/build-k8s.sh): "$GPUFERRY_CACHE/wireguard-go-<version>/bin/wireguard-go"
# (default cache ~/.cache/gpuferry). Debian's wireguard-go (0.0.20220316) lacks the GSO/GRO
# offloads and is several times slower; netfabric prefers this build when it exists and falls back
# to the wireguard-go on PATH otherwise. A folder is complete only when its .complete stamp exists.
#
# Usage: hack/build-wireguard-go.sh [--print-bin]
set -euo pipefail

# Pinned pseudo-version of golang.zx2c4.com/wireguard (the project tags no releases).
WIREGUARD_GO_VERSION=${WIREGUARD_GO_VERSION:-v0.0.0-20260522210424-ecfc5a8d5446}

cache=${GPUFERRY_CACHE:-$HOME/.cache/gpuferry}
dir=$cache/wireguard-go-$WIREGUARD_GO_VERSION
if [[ "${1:-}" == "--print-bin" ]]; then
  printf '%s\n' "$dir/bin/wireguard-go"
  exit 0
fi
log() { printf '[build-wireguard-go %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
if [[ -f "$dir/.complete" ]]; then
  log "cached in $dir"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  echo "build-wireguard-go: Go is not installed; netfabric will use Debian's wireguard-go" >&2
  exit 2
fi
log "building golang.zx2c4.com/wireguard@$WIREGUARD_GO_VERSION into $dir"
start=$SECONDS
rm -rf "$dir.partial"
mkdir -p "$dir.partial/bin"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(
  cd "$work"
  export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
  go mod init gpuferry.local/wgbuild >/dev/null 2>&1
  go get "golang.zx2c4.com/wireguard@$WIREGUARD_GO_VERSION" >/dev/null
  go build -trimpath -ldflags "-s -w" -o "$dir.partial/bin/wireguard-go" golang.zx2c4.com/wireguard
)
date -u +%FT%TZ > "$dir.partial/.complete"
rm -rf "$dir"
mv "$dir.partial" "$dir"
log "built in $((SECONDS - start))s"
