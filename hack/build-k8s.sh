#!/usr/bin/env bash
# Build the real Kubernetes control plane (kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl), etcd, kwok and helm from source through the Go module proxy.
#
# Output goes to "$GPUFERRY_CACHE" (default ~/.cache/gpuferry), one folder per component and
# version, e.g. ~/.cache/gpuferry/k8s-v1.36.4/bin/kube-apiserver. A folder is complete only when
# its .complete stamp exists; a second run with every stamp present does nothing.
#
# Usage: hack/build-k8s.sh [--print-bin-dirs]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

cache=${GPUFERRY_CACHE:-$HOME/.cache/gpuferry}
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod

k8s_dir=$cache/k8s-$K8S_VERSION
etcd_dir=$cache/etcd-$ETCD_VERSION
kwok_dir=$cache/kwok-$KWOK_VERSION
helm_dir=$cache/helm-$HELM_VERSION

if [[ "${1:-}" == "--print-bin-dirs" ]]; then
  printf '%s\n' "$k8s_dir/bin" "$etcd_dir/bin" "$kwok_dir/bin" "$helm_dir/bin"
  exit 0
fi

log() { printf '[build-k8s %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

need_go() {
  local have
  have=$(go env GOVERSION 2>/dev/null || true)
  if [[ -z "$have" ]]; then
    echo "build-k8s: Go is not installed; Go >= 1.26 is needed to build Kubernetes $K8S_VERSION" >&2
    exit 2
  fi
  case "$have" in
    go1.2[6-9]*|go1.[3-9]*) ;;
    *) echo "build-k8s: $have is too old; Kubernetes $K8S_VERSION needs Go >= 1.26" >&2; exit 2 ;;
  esac
}

# build_step NAME DIR COMMAND...: runs COMMAND unless DIR/.complete exists; times it.
build_step() {
  local name=$1 dir=$2; shift 2
  if [[ -f "$dir/.complete" ]]; then
    log "$name: cached in $dir"
    return 0
  fi
  need_go
  log "$name: building into $dir"
  rm -rf "$dir.partial"
  mkdir -p "$dir.partial/bin"
  local start=$SECONDS
  "$@" "$dir.partial"
  date -u +%FT%TZ > "$dir.partial/.complete"
  rm -rf "$dir"
  mv "$dir.partial" "$dir"
  log "$name: built in $((SECONDS - start))s"
}

build_k8s() {
  local out=$1 minor ld
  minor=$(cut -d. -f2 <<<"$K8S_VERSION")
  ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ld="$ld -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  (cd "$here/k8s-build" && go build -trimpath -ldflags "$ld" -o "$out/bin/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubectl)
}

build_etcd() {
  local out=$1
  (cd "$here/etcd-build" && go build -trimpath -ldflags "-s -w" -o "$out/bin/etcd" go.etcd.io/etcd/server/v3)
}

build_kwok() {
  local out=$1 src
  GOBIN=$out/bin go install -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v} -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=${K8S_VERSION#v}" \
    "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  # kwok has no built-in stages: keep the upstream stage files beside the binary so that
  # clusters do not depend on the Go module cache still holding them.
  src=$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION/kustomize/stage
  mkdir -p "$out/stage"
  cp -r "$src/." "$out/stage/"
  chmod -R u+w "$out/stage"
}

build_helm() {
  local out=$1 minor
  minor=$(cut -d. -f2 <<<"$K8S_VERSION")
  GOBIN=$out/bin go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
}

total=$SECONDS
build_step "etcd $ETCD_VERSION" "$etcd_dir" build_etcd
build_step "kwok $KWOK_VERSION" "$kwok_dir" build_kwok
build_step "kubernetes $K8S_VERSION" "$k8s_dir" build_k8s
build_step "helm $HELM_VERSION" "$helm_dir" build_helm
log "all components ready in $((SECONDS - total))s (cache: $cache)"
