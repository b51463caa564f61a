"""The virtual node's kubelet API (logs, exec, attach, port-forward, pods, stats), served over
TLS with a certificate from the consumer's CSR API and authorised like a real kubelet."""

from __future__ import annotations

from .server import KubeletContext, make_app, serve_kubelet_api

__all__ = ["KubeletContext", "make_app", "serve_kubelet_api"]
