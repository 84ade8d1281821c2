"""Skill Hub services: definitions, access, executions, Git import (docs/skills.md)."""
