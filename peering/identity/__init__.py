"""The consumer's client identity on a provider: keys, CSRs, the peering-token proof, kubeconfigs."""
