from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def home(request: HttpRequest) -> HttpResponse:
    """The landing page: where the API, its docs and the admin are."""
    return render(request, "frontend/home.html")
