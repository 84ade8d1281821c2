"""Skill Hub: sandboxed code skills as tools (not built yet; see the open issue)."""
