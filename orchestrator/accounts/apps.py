from __future__ import annotations

from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "orchestrator.accounts"
    label = "accounts"
    verbose_name = "Accounts and API tokens"

    def ready(self) -> None:
        from orchestrator.accounts import schema  # noqa: F401  (registers the OpenAPI extension)
