"""A chat at ``/v1/chat/completions`` with an employee that binds the ``skill`` tool and is
listed by a skills directory: the ``<available_skills>`` catalogue reaches the model in the
system prompt, and the ``skill`` tool answers with the instructions of an allowed skill (a name
it may not load is a tool error naming the allowed ones). The real app under uvicorn, the
official SDK, a model over loopback HTTP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest

from skillhub.services.directories import skill_directory_create, skill_directory_sync
from tests.gateway.conftest import Team, make_model_server, model_server, server, team, weather
from tests.support.model_server import Completion

__all__ = ["make_model_server", "model_server", "server", "team", "weather"]

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def test_the_catalogue_is_in_the_prompt_and_the_skill_tool_loads_instructions(
    server: str, team: Team, tmp_path: Path, settings: Any
) -> None:
    settings.LOOPWRIGHT_SKILLS_ROOT = str(tmp_path)
    for name, body in {"pdf": "Use pdftk to fill forms.", "secret": "Not for ada."}.items():
        (tmp_path / "team" / name).mkdir(parents=True)
        (tmp_path / "team" / name / "SKILL.md").write_text(
            f"---\nname: {name}\ndescription: The {name} skill.\n---\n{body}\n"
        )
    ada = team.employee("ada", tools=["skill"])
    directory = skill_directory_create(
        key="team", source="folder", path="team", employees=["ada"], skills=["pdf"]
    )
    skill_directory_sync(directory=directory)
    key = team.caller("alice", ada)
    team.model.queue(Completion(tool_calls=[("skill", json.dumps({"name": "secret"}))]))
    team.model.queue(Completion(tool_calls=[("skill", json.dumps({"name": "pdf"}))]))
    team.model.queue(Completion(content="Filled."))
    with openai.OpenAI(base_url=f"{server}/v1", api_key=key, max_retries=0, timeout=30) as sdk:
        reply = sdk.chat.completions.create(
            model="ada", messages=[{"role": "user", "content": "Fill the form."}]
        )
    assert reply.choices[0].message.content == "Filled."
    first = team.model.bodies[0]
    system = first["messages"][0]["content"]
    assert "<available_skills>" in system and "- pdf: The pdf skill." in system
    assert "secret" not in system and "Use pdftk" not in system
    assert "skill" in [t["function"]["name"] for t in first["tools"]]
    refused = team.model.bodies[1]["messages"][-1]
    assert refused["role"] == "tool" and "The skills you may load: pdf." in refused["content"]
    loaded = team.model.bodies[2]["messages"][-1]
    assert loaded["role"] == "tool" and "Use pdftk to fill forms." in loaded["content"]
    assert 'source="team:pdf/SKILL.md"' in loaded["content"]
