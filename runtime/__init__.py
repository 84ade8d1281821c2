"""The agent runtime: model client, tool loop and tools. Plain Python, little Django."""
