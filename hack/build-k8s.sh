#!/usr/bin/env bash
# Build the real Kubernetes control plane (kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl), etcd, kwok and helm from source through the Go module proxy, and what each local
# cluster's real node runs: kubelet, kube-proxy, containerd 2 (+ its runc shim and ctr), the CNI
# plugins (ptp, bridge, host-local, loopback, portmap), CoreDNS and metrics-server. runc itself is
# Debian's (hack/setup.sh installs it): built from the proxy without libseccomp it refuses
# containerd's default seccomp profile.
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
node_dir=$cache/kubelet-$K8S_VERSION
containerd_dir=$cache/containerd-$CONTAINERD_VERSION
cni_dir=$cache/cni-plugins-$CNI_PLUGINS_VERSION
coredns_dir=$cache/coredns-$COREDNS_VERSION
metrics_dir=$cache/metrics-server-$METRICS_SERVER_VERSION
kueue_dir=$cache/kueue-$KUEUE_VERSION

if [[ "${1:-}" == "--print-bin-dirs" ]]; then
  printf '%s\n' "$k8s_dir/bin" "$etcd_dir/bin" "$kwok_dir/bin" "$helm_dir/bin" "$node_dir/bin" \
    "$containerd_dir/bin" "$cni_dir/bin" "$coredns_dir/bin" "$metrics_dir/bin" "$kueue_dir/bin"
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

k8s_ldflags() {
  local minor ld p
  minor=$(cut -d. -f2 <<<"$K8S_VERSION")
  ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ld="$ld -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  printf '%s' "$ld"
}

build_k8s() {
  local out=$1
  (cd "$here/k8s-build" && go build -trimpath -ldflags "$(k8s_ldflags)" -o "$out/bin/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubectl)
}

# kubelet and kube-proxy: same wrapper module and version stamp as the control plane; a folder of
# their own so that adding them did not invalidate an existing control-plane cache
build_node() {
  local out=$1
  (cd "$here/k8s-build" && go build -trimpath -ldflags "$(k8s_ldflags)" -o "$out/bin/" \
    k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-proxy)
}

build_containerd() {
  local out=$1 v=github.com/containerd/containerd/v2/version
  GOBIN=$out/bin go install -trimpath -tags "no_btrfs no_devmapper no_zfs" \
    -ldflags "-s -w -X $v.Version=$CONTAINERD_VERSION -X $v.Revision=proxy" \
    "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION"
}

build_cni() {
  local out=$1 m=github.com/containernetworking/plugins p
  for p in main/ptp main/bridge main/loopback ipam/host-local meta/portmap; do
    GOBIN=$out/bin go install -trimpath \
      -ldflags "-s -w -X $m/pkg/utils/buildversion.BuildVersion=$CNI_PLUGINS_VERSION" \
      "$m/plugins/$p@$CNI_PLUGINS_VERSION"
  done
}

# CoreDNS with only the plugins cluster DNS needs (hack/coredns-build/main.go)
build_coredns() {
  local out=$1
  (cd "$here/coredns-build" && go build -trimpath -ldflags "-s -w" -o "$out/bin/coredns" .)
}

build_metrics_server() {
  local out=$1 v=k8s.io/client-go/pkg/version
  GOBIN=$out/bin go install -trimpath \
    -ldflags "-s -w -X $v.gitVersion=$METRICS_SERVER_VERSION -X $v.gitTreeState=clean" \
    "sigs.k8s.io/metrics-server/cmd/metrics-server@$METRICS_SERVER_VERSION"
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

# Kueue: `go install sigs.k8s.io/kueue/cmd/kueue@v0.10.0` is refused (its go.mod has replace
# directives), so the module is fetched from the proxy and built as the main module from a copy
# (its dependencies from the proxy too). Its CRDs and webhook manifests are kept beside the binary.
build_kueue() {
  local out=$1 src work
  go mod download "sigs.k8s.io/kueue@$KUEUE_VERSION"
  src=$(go env GOMODCACHE)/sigs.k8s.io/kueue@$KUEUE_VERSION
  work=$(mktemp -d)
  cp -r "$src/." "$work/"
  chmod -R u+w "$work"
  rm -rf "$work/vendor"
  (cd "$work" && GOFLAGS=-mod=mod go build -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" -o "$out/bin/kueue" ./cmd/kueue)
  mkdir -p "$out/crds"
  cp "$work"/config/components/crd/bases/*.yaml "$out/crds/"
  cp "$work"/config/components/webhook/manifests.yaml "$out/webhooks.yaml"
  rm -rf "$work"
}

total=$SECONDS
build_step "etcd $ETCD_VERSION" "$etcd_dir" build_etcd
build_step "kwok $KWOK_VERSION" "$kwok_dir" build_kwok
build_step "kubernetes $K8S_VERSION" "$k8s_dir" build_k8s
build_step "helm $HELM_VERSION" "$helm_dir" build_helm
build_step "kubelet, kube-proxy $K8S_VERSION" "$node_dir" build_node
build_step "containerd $CONTAINERD_VERSION" "$containerd_dir" build_containerd
build_step "CNI plugins $CNI_PLUGINS_VERSION" "$cni_dir" build_cni
build_step "CoreDNS $COREDNS_VERSION" "$coredns_dir" build_coredns
build_step "metrics-server $METRICS_SERVER_VERSION" "$metrics_dir" build_metrics_server
build_step "kueue $KUEUE_VERSION" "$kueue_dir" build_kueue
log "all components ready in $((SECONDS - total))s (cache: $cache)"
