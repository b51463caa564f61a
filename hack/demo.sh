#!/usr/bin/env bash
# The demo: build what is missing, start a consumer and a provider cluster on loopback, show the
# provider's GPU nodes and how to use each cluster with kubectl. Run through `make demo`.
#
# What later steps add here (peer, offload a namespace, run a GPU job) lands with the peering
# and virtual-kubelet work; today the demo stops at two real clusters.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
py=.venv/bin/python
profile=${GPUFERRY_PROFILE:-demo}

$py -m hack.localcluster --profile "$profile" up
kubectl=$(bash hack/build-k8s.sh --print-bin-dirs | head -1)/kubectl
eval "$($py -m hack.localcluster --profile "$profile" env)"

for var in GPUFERRY_CONSUMER_KUBECONFIG GPUFERRY_PROVIDER_KUBECONFIG; do
  .venv/bin/gpuferry install crds --quiet --kubeconfig "${!var}"
done

cols='NAME:.metadata.name,READY:.status.conditions[?(@.type=="Ready")].status,CPU:.status.allocatable.cpu,MEMORY:.status.allocatable.memory,GPUS:.status.allocatable.nvidia\.com/gpu,PRODUCT:.metadata.labels.nvidia\.com/gpu\.product'
for side in CONSUMER PROVIDER; do
  var=GPUFERRY_${side}_KUBECONFIG
  echo
  echo "== ${side,,} cluster ($("$kubectl" --kubeconfig "${!var}" version -o json | $py -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])'))"
  "$kubectl" --kubeconfig "${!var}" get nodes -o custom-columns="$cols"
done

cat <<MSG

Both clusters run as local processes; point kubectl at them with:
  export KUBECONFIG=$GPUFERRY_CONSUMER_KUBECONFIG   # consumer
  export KUBECONFIG=$GPUFERRY_PROVIDER_KUBECONFIG   # provider
  alias kubectl=$kubectl  # the kubectl built with them
  .venv/bin/gpuferry version --kubeconfig \$KUBECONFIG   # server version, gpuferry CRDs
Status: make status    Stop and clean up: make down
MSG
