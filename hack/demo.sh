#!/usr/bin/env bash
# The demo, run through `make demo`: build what is missing, start a consumer and a provider
# cluster on loopback, install gpuferry in both with `gpuferry install` (its controllers, virtual
# kubelet, gateway and route agent run as pods on each cluster's real node), peer them with
# `gpuferry peer`, offload a namespace, create a GPU Job with plain kubectl, show it on the virtual
# node (consumer) and as twins (provider), then `gpuferry info`. Idempotent: running it again
# reuses the clusters, the installation and the peering. Without root there is no real node: the
# controllers then run on this machine (--agents local, development mode), without the network.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
py=.venv/bin/python
gf=.venv/bin/gpuferry
profile=${GPUFERRY_PROFILE:-demo}
ns=${GPUFERRY_DEMO_NAMESPACE:-ml-team}

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

$py -m hack.localcluster --profile "$profile" up
kubectl=$(bash hack/build-k8s.sh --print-bin-dirs | sed -n 1p)/kubectl  # sed reads it all: head could SIGPIPE it
eval "$($py -m hack.localcluster --profile "$profile" env)"
C=$GPUFERRY_CONSUMER_KUBECONFIG
P=$GPUFERRY_PROVIDER_KUBECONFIG

cols='NAME:.metadata.name,READY:.status.conditions[?(@.type=="Ready")].status,GPUS:.status.allocatable.nvidia\.com/gpu,PRODUCT:.metadata.labels.nvidia\.com/gpu\.product'
step "provider cluster: its GPU nodes (simulated by kwok, and real-0: a real kubelet and containerd)"
"$kubectl" --kubeconfig "$P" get nodes -o custom-columns="$cols,RUNTIME:.status.nodeInfo.containerRuntimeVersion"
if "$kubectl" --kubeconfig "$C" get node real-0 >/dev/null 2>&1; then
  step "consumer cluster: CoreDNS and metrics-server run as real containers on its real node"
  "$kubectl" --kubeconfig "$C" -n kube-system get pods -o wide
fi

if "$kubectl" --kubeconfig "$C" get node real-0 >/dev/null 2>&1; then
  values=$(mktemp -d)
  trap 'rm -rf "$values"' EXIT
  for side in provider consumer; do
    $py -m hack.localcluster --profile "$profile" --cluster "$side" values >"$values/$side.yaml"
  done
  step "gpuferry install: the provider's controller, gateway and route agent, as pods on its real node"
  $gf install --role provider --cluster-id gpu-farm --kubeconfig "$P" -f "$values/provider.yaml"
  step "gpuferry install: the consumer's agent (it runs a virtual kubelet per provider), gateway and route agent"
  $gf install --role consumer --cluster-id ml-eu --kubeconfig "$C" -f "$values/consumer.yaml"
  # the consumer's pods reach the provider's API server at the host's address, not at loopback
  how=(--remote-server "$GPUFERRY_PROVIDER_SERVER")
  undo="$gf uninstall --kubeconfig $C; $gf uninstall --kubeconfig $P"
  unpeer_flags=""
  network="and the gateways' WireGuard tunnel joins the pod networks"
else
  how=(--agents local --no-network)  # no real node without root: development mode, no network
  undo="$gf agents stop"
  unpeer_flags=" --agents local"
  network="the controllers as processes on this machine: no root, no real node"
fi
step "gpuferry peer: the consumer borrows 8 H100 GPUs from the provider ($network)"
$gf peer --kubeconfig "$C" --remote-kubeconfig "$P" --cluster-id ml-eu --remote-cluster-id gpu-farm \
  --gpus 8 --selector nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3 "${how[@]}"

step "consumer cluster: the ForeignCluster the controllers drove through its four conditions"
"$kubectl" --kubeconfig "$C" get foreignclusters

step "consumer cluster: a virtual node advertises them"
"$kubectl" --kubeconfig "$C" get nodes -o custom-columns="$cols,LARGEST-BLOCK:.metadata.labels.gpuferry\.io/largest-gpu-block"

step "gpuferry offload namespace $ns"
"$kubectl" --kubeconfig "$C" create namespace "$ns" --dry-run=client -o yaml | "$kubectl" --kubeconfig "$C" apply -f - >/dev/null
$gf offload namespace "$ns" --kubeconfig "$C"

step "an ML engineer: kubectl create -f job.yaml (no toleration, no node selector)"
job=finetune-$(date +%H%M%S)
cat <<YAML | tee -a /dev/stderr | "$kubectl" --kubeconfig "$C" -n "$ns" create -f -
apiVersion: batch/v1
kind: Job
metadata: {name: $job}
spec:
  completions: 4
  parallelism: 4
  template:
    metadata:
      annotations: {gpuferry.io/simulate-complete-after: "20s"}  # kwok: the "training" takes 20 s
    spec:
      restartPolicy: Never
      containers:
      - name: train
        image: nvcr.io/nvidia/pytorch:25.01-py3
        resources: {limits: {nvidia.com/gpu: "2"}}
YAML
"$kubectl" --kubeconfig "$C" -n "$ns" wait --for=jsonpath='{.status.ready}'=4 "job/$job" --timeout=120s >/dev/null

step "consumer: the Job's pods Running on the virtual node"
"$kubectl" --kubeconfig "$C" -n "$ns" get pods -l "job-name=$job" -o wide
step "provider: their twins on H100 nodes, in the twin namespace"
"$kubectl" --kubeconfig "$P" -n "$ns-ml-eu" get pods -o wide

step "gpuferry network status: the tunnel, both clusters on 10.244.0.0/16, each seeing the other remapped"
$gf network status --kubeconfig "$C"
if [[ ${how[0]} == --remote-server ]]; then
  step "consumer: gpuferry itself, as pods (the virtual kubelet gf-vk-gpu-farm among them)"
  "$kubectl" --kubeconfig "$C" -n gpuferry-system get pods -o wide
fi

step "gpuferry info (consumer, then provider)"
$gf info --kubeconfig "$C"
$gf info --kubeconfig "$P"

"$kubectl" --kubeconfig "$C" -n "$ns" wait --for=condition=Complete "job/$job" --timeout=120s >/dev/null
step "the Job completed on the consumer"
"$kubectl" --kubeconfig "$C" -n "$ns" get job "$job"

cat <<MSG

Try it yourself:
  export KUBECONFIG=$C   # the consumer (the provider: $P)
  alias kubectl=$kubectl
  kubectl -n $ns create job gpu-test --image=cuda -- nvidia-smi   # add GPU limits to land remotely
  $gf info -o yaml
Undo: $gf unoffload namespace $ns --kubeconfig $C
      $gf unpeer --kubeconfig $C --remote-kubeconfig $P$unpeer_flags
      $undo
Stop the clusters: make down
MSG
