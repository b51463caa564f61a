"""The gpuferry command line (liqoctl-like)."""
