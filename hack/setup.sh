#!/usr/bin/env bash
# Everything the demo and the tests need on a fresh machine, idempotent and quick when done:
# Debian packages that are missing, a virtualenv with gpuferry and its test tools, and the
# Kubernetes binaries built from source (cached in ~/.cache/gpuferry, see hack/build-k8s.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '[setup %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

# command -> Debian package that provides it
declare -A debs=(
  [ip]=iproute2
  [openssl]=openssl
  [nft]=nftables
  [wireguard-go]=wireguard-go
  [ping]=iputils-ping
  [sysctl]=procps
  [iperf3]=iperf3
  # the real node of each local cluster: Debian's runc runs its containers (built from the
  # proxy without libseccomp, runc refuses containerd's default seccomp profile); nsenter
  # (util-linux) starts containerd, kubelet and kube-proxy in the node's network namespace
  [runc]=runc
  [nsenter]=util-linux
  # images built here without Docker (hack/images): a Debian root file system for the gpuferry
  # image, and the static pause binary
  [mmdebstrap]=mmdebstrap
  [gcc]=gcc
)

missing=()
for cmd in "${!debs[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${debs[$cmd]}")
done
# gcc -static (the pause image) needs glibc's static library
[[ -f /usr/lib/x86_64-linux-gnu/libc.a ]] || missing+=(libc6-dev)
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup: need root to install ${missing[*]} (or install them yourself)" >&2
    exit 2
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "setup: gpuferry needs Python >= 3.11; $python is $("$python" --version 2>&1)" >&2
  exit 2
fi
if [[ ! -x .venv/bin/python ]]; then
  log "creating .venv"
  "$python" -m venv .venv
fi
stamp=.venv/.gpuferry-installed
if [[ ! -f $stamp || pyproject.toml -nt $stamp ]]; then
  log "installing gpuferry and its test tools into .venv"
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[test,lint]'
  touch "$stamp"
fi

bash hack/build-k8s.sh
# a current userspace WireGuard for the network fabric (Debian's is the fallback)
bash hack/build-wireguard-go.sh || log "wireguard-go not built: the fabric falls back to Debian's"
