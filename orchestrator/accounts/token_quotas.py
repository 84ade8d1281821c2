"""Changing an API token's daily quotas at the OpenAI-compatible endpoint (docs/api.md,
"API tokens"). Holds: a stored quota is None or fits its column and is not negative; a refused
change is an InvalidInput naming each bad field and changes nothing.

Apart from :mod:`orchestrator.accounts.services` because it raises the API's errors, and those
import DRF, whose settings import the bearer authentication that the services serve.
"""

from __future__ import annotations

from typing import Any

from orchestrator.accounts.models import ApiToken
from orchestrator.accounts.services import QUOTA_FIELDS, api_token_quota_problems
from orchestrator.errors import invalid_fields


def api_token_quotas_check(values: dict[str, Any]) -> None:
    """InvalidInput naming each quota of ``values`` that may not be stored."""
    problems = api_token_quota_problems(values)
    if problems:
        raise invalid_fields(problems)


def api_token_quotas_update(*, token: ApiToken, **values: Any) -> ApiToken:
    """Set the token's daily quotas named in ``values`` (``daily_token_quota``,
    ``daily_cost_quota``; None: no quota). The token's next chat request is judged by them."""
    unknown = sorted(set(values) - set(QUOTA_FIELDS))
    if unknown:
        raise ValueError(f"not a quota field: {unknown}")
    api_token_quotas_check(values)
    if values:
        ApiToken.objects.filter(pk=token.pk).update(**values)
        token.refresh_from_db()
    return token
