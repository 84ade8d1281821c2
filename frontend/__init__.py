"""The operator's web UI."""
