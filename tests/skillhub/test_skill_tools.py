"""The skill tool provider behind the production registry: which specs it lists, the hook in
ToolRegistry (opt-in, after the registered tools), approval re-checks finding skill specs, and
the review gate in the role tool policy."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from loops.worker.invoker import AgentInvoker
from runtime.tools import ToolRegistry
from runtime.tools.registry import provider_review_gates, tool_providers
from runtime.tools.specs import tool_spec
from runtime.types import Effect
from skillhub.models import Skill, SkillLoopConfig
from skillhub.tools import (
    EXECUTE,
    SKILL_TOOLS,
    SkillToolProvider,
)
from tests.skillhub.conftest import NUMBERS

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    SKILL_TOOLS.invalidate()


def test_the_skillhub_app_registers_its_provider() -> None:
    assert SKILL_TOOLS in tool_providers()


def test_enabled_skills_become_tools_with_their_schema(make_skill: Callable[..., Skill]) -> None:
    make_skill()
    make_skill("py_auto", auto_call=True)
    make_skill("py_off", enabled=False)
    provider = SkillToolProvider(cache_seconds=0)
    specs = {s.name: s for s in provider.specs()}
    assert sorted(specs) == [EXECUTE, "skill_hub_py_add", "skill_hub_py_auto"]
    assert specs["skill_hub_py_add"].parameters == NUMBERS
    assert specs["skill_hub_py_add"].effect == Effect.WRITE
    assert specs["skill_hub_py_auto"].effect == Effect.READ
    assert provider.get("skill_hub_py_off") is None and provider.get("read") is None


def test_providers_are_opt_in_and_come_after_registered_tools(
    make_skill: Callable[..., Skill],
) -> None:
    make_skill()
    assert ToolRegistry().names() == []
    registry = ToolRegistry(providers=[SkillToolProvider(cache_seconds=0)])
    assert "skill_hub_py_add" in registry and EXECUTE in registry.names()
    invoker = AgentInvoker()
    assert "read" in invoker.tools and "skill_hub_py_add" in invoker.tools


def test_approval_rechecks_find_skill_specs(make_skill: Callable[..., Skill]) -> None:
    make_skill()
    spec = tool_spec("skill_hub_py_add")
    assert spec is not None and spec.parameters == NUMBERS
    assert tool_spec("skill_hub_nope") is None


def test_a_review_config_turns_allow_into_ask_but_never_deny_into_ask(
    make_skill: Callable[..., Skill],
) -> None:
    skill = make_skill()
    other = make_skill("py_other")
    SkillLoopConfig.objects.create(skill=skill, review_prompt="Look closely.")
    SkillLoopConfig.objects.create(skill=other, review_prompt="x")
    decisions = {"skill_hub_py_add": ("allow", "trusted"), "skill_hub_py_other": ("deny", "no")}
    assert provider_review_gates(decisions) == {
        "skill_hub_py_add": ("ask", "Skill review required: Look closely.")
    }
