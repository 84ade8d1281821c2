"""Skill Hub: code skills run in the sandbox and offered as tools to runs, the API and MCP."""
