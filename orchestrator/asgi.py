"""One ASGI app served by uvicorn: Django (API, UI, admin). The MCP server mounts here later."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator.settings")
application = get_asgi_application()
