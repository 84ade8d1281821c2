"""An API token's daily quotas bind the chats made with it: every completion adds its tokens and
cost (the endpoint's prices) to the token's day, and once one quota is used up the next request
is a 429 ``quota_exceeded`` with ``Retry-After`` that reaches no model; other tokens go on. The
quotas are set with ``manage.py create_api_token`` or ``PATCH /api/v1/api-tokens/{prefix}``
(admins). The real app under uvicorn, the official SDK, a model over loopback HTTP."""

from __future__ import annotations

import io
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import openai
import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from gateway.models import ChatCompletionRecord, TokenUsageDay
from gateway.services import grant_create
from orchestrator.accounts.models import ApiToken
from orchestrator.accounts.services import api_token_create, user_ensure
from orchestrator.agents.models import Employee, ModelEndpoint
from tests.gateway.conftest import Team
from tests.support.model_server import Completion
from tests.support.workers import wait_for

HI = [{"role": "user", "content": "hi"}]


def priced(team: Team) -> Employee:
    """``ada`` on the loopback model, each completion (10 + 5 tokens) costing 0.02."""
    ada = team.employee("ada")
    ModelEndpoint.objects.filter(pk=ada.endpoint_id).update(
        input_price_per_token=Decimal("0.001"), output_price_per_token=Decimal("0.002")
    )
    return ada


def key_of(username: str, ada: Employee, **quotas: Any) -> str:
    user = user_ensure(username=username)
    grant_create(employee=ada, user=user, actor="test")
    return api_token_create(user=user, name="quota-test", **quotas)


def used(key: str) -> tuple[int, Decimal] | None:
    row = TokenUsageDay.objects.filter(token__prefix=key.split("_")[1]).first()
    return None if row is None else (row.tokens, row.cost)


def sdk(server: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key=key, max_retries=0, timeout=30)


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
class TestChatTokenDailyQuota:
    def test_a_token_over_its_token_quota_is_429_and_other_tokens_go_on(
        self, server: str, team: Team
    ) -> None:
        ada = priced(team)
        alice, bob = key_of("alice", ada, daily_token_quota=20), key_of("bob", ada)
        team.model.queue(Completion(content="one"), Completion(content="two"))
        with sdk(server, alice) as client:
            client.chat.completions.create(model="ada", messages=HI)
            wait_for(lambda: used(alice) == (15, Decimal("0.02")), 10)
            client.chat.completions.create(model="ada", messages=HI)  # 15 < 20: admitted
            wait_for(lambda: used(alice) == (30, Decimal("0.04")), 10)
            with pytest.raises(openai.RateLimitError) as refused:
                client.chat.completions.create(model="ada", messages=HI)
        assert refused.value.code == "quota_exceeded"
        assert (
            f'API token "lw_{alice.split("_")[1]}_…" has used its daily tokens quota (20; 30 today)'
            in str(refused.value)
        )
        assert 0 < int(refused.value.response.headers["Retry-After"]) <= 86_401
        assert len(team.model.bodies) == 2  # the refused request reached no model
        team.model.queue(Completion(content="bob's"))
        with sdk(server, bob) as client:
            answer = client.chat.completions.create(model="ada", messages=HI)
        assert answer.choices[0].message.content == "bob's"
        wait_for(lambda: used(bob) == (15, Decimal("0.02")), 10)
        wait_for(lambda: ChatCompletionRecord.objects.filter(status="blocked").count() == 1, 10)
        assert used(alice) == (30, Decimal("0.04"))

    def test_a_token_over_its_cost_quota_is_429_streamed_or_not(
        self, server: str, team: Team
    ) -> None:
        ada = priced(team)
        carol = key_of("carol", ada, daily_cost_quota=Decimal("0.01"))
        team.model.queue(Completion(content="one"))
        with sdk(server, carol) as client:
            client.chat.completions.create(model="ada", messages=HI)
            wait_for(lambda: used(carol) == (15, Decimal("0.02")), 10)
            with pytest.raises(openai.RateLimitError) as refused:
                client.chat.completions.create(model="ada", messages=HI, stream=True)
        assert refused.value.code == "quota_exceeded"
        assert "has used its daily cost quota (0.01; 0.02 today)" in str(refused.value)
        assert refused.value.response.headers["Content-Type"].startswith("application/")
        assert int(refused.value.response.headers["Retry-After"]) > 0
        assert len(team.model.bodies) == 1


@pytest.mark.django_db
class TestApiTokenQuotaSettings:
    def test_admins_set_and_read_the_quotas_never_the_secret(
        self, api_client_for: Callable[[str], APIClient]
    ) -> None:
        admin = api_client_for("admin")
        key = api_token_create(user=user_ensure(username="dora"), name="dora's")
        url = f"/api/v1/api-tokens/{key.split('_')[1]}"
        changed = admin.patch(
            url, {"daily_token_quota": 1000, "daily_cost_quota": "2.5"}, format="json"
        )
        assert changed.status_code == 200, changed.content
        assert changed.json()["daily_token_quota"] == 1000
        assert Decimal(changed.json()["daily_cost_quota"]) == Decimal("2.5")
        listed = admin.get("/api/v1/api-tokens").json()
        rows = listed["results"] if isinstance(listed, dict) else listed
        dora = next(r for r in rows if r["user"] == "dora")
        assert dora["daily_token_quota"] == 1000 and dora["name"] == "dora's"
        assert key.split("_", 2)[2] not in str(listed) and "secret_hash" not in dora
        cleared = admin.patch(url, {"daily_cost_quota": None}, format="json")
        assert cleared.json()["daily_cost_quota"] is None
        assert cleared.json()["daily_token_quota"] == 1000
        assert api_client_for("operator").patch(url, {"daily_token_quota": 1}).status_code == 403

    @pytest.mark.parametrize("field", ["daily_token_quota", "daily_cost_quota"])
    def test_a_negative_quota_is_a_400_naming_the_field(
        self, api_client_for: Callable[[str], APIClient], field: str
    ) -> None:
        key = api_token_create(user=user_ensure(username="erin"))
        url = f"/api/v1/api-tokens/{key.split('_')[1]}"
        refused = api_client_for("admin").patch(url, {field: -1}, format="json")
        assert refused.status_code == 400
        assert refused["Content-Type"] == "application/problem+json"
        assert [e["pointer"] for e in refused.json()["errors"]] == [f"/{field}"]
        token = ApiToken.objects.get(prefix=key.split("_")[1])
        assert token.daily_token_quota is None and token.daily_cost_quota is None

    def test_the_cli_sets_the_quotas_and_refuses_a_negative_one(self) -> None:
        out = io.StringIO()
        call_command(
            "create_api_token", "frank", "--role", "viewer",
            "--daily-token-quota", "500", "--daily-cost-quota", "1.25", stdout=out,
        )  # fmt: skip
        token = ApiToken.objects.get(prefix=out.getvalue().strip().split("_")[1])
        assert (token.daily_token_quota, token.daily_cost_quota) == (500, Decimal("1.25"))
        with pytest.raises(CommandError, match="daily_cost_quota must not be negative"):
            call_command(
                "create_api_token", "gina", "--role", "viewer", "--daily-cost-quota=-1",
                stdout=io.StringIO(),
            )  # fmt: skip
        assert not User.objects.filter(username="gina").exists()
