"""Network fabric: WireGuard between clusters, 1:1 prefix NAT for overlapping CIDRs, routes."""
