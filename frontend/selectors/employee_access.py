"""Read-only queries of an employee's OpenAI-compatible endpoint panel: who is granted the
employee, and its latest chat completion records (no message contents are ever stored)."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.models import User
from django.http import HttpRequest

from gateway.models import ChatCompletionRecord, EmployeeGrant
from orchestrator.agents.models import Employee

#: How many of the employee's latest chat completion records the page lists.
LATEST_RECORDS = 20


@dataclass(frozen=True)
class EndpointExample:
    """What a client needs to call the employee: base URL, model name and ready examples."""

    base_url: str
    model: str

    @property
    def curl(self) -> str:
        body = (
            f'{{"model": "{self.model}", "messages": [{{"role": "user", "content": "Hello"}}], '
            '"stream": true}'
        )
        return (
            f"curl {self.base_url}/chat/completions \\\n"
            '  -H "Authorization: Bearer $LOOPWRIGHT_API_KEY" \\\n'
            '  -H "Content-Type: application/json" \\\n'
            f"  -d '{body}'"
        )

    @property
    def python(self) -> str:
        return (
            "import os\n\n"
            "from openai import OpenAI\n\n"
            f'client = OpenAI(base_url="{self.base_url}", '
            'api_key=os.environ["LOOPWRIGHT_API_KEY"])\n'
            "reply = client.chat.completions.create(\n"
            f'    model="{self.model}",\n'
            '    messages=[{"role": "user", "content": "Hello"}],\n'
            ")\n"
            "print(reply.choices[0].message.content)"
        )


def endpoint_example(request: HttpRequest, employee: Employee) -> EndpointExample:
    """The endpoint as the browser reached this server: its origin + ``/v1``, model = username."""
    return EndpointExample(request.build_absolute_uri("/v1").rstrip("/"), employee.username)


def grants(employee: Employee) -> list[EmployeeGrant]:
    """The users granted ``employee``, by username."""
    rows = EmployeeGrant.objects.filter(employee=employee).select_related("user")
    return list(rows.order_by("user__username"))


def latest_records(employee: Employee, limit: int = LATEST_RECORDS) -> list[ChatCompletionRecord]:
    """The employee's latest chat completion records, newest first."""
    rows = ChatCompletionRecord.objects.filter(employee_username=employee.username)
    return list(rows.select_related("user").order_by("-created_at")[:limit])


def user_or_none(username: str) -> User | None:
    """The user called ``username``, or None."""
    return User.objects.filter(username=username).first()
