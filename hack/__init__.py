"""Developer tooling: build the Kubernetes control plane from source and run local clusters."""
