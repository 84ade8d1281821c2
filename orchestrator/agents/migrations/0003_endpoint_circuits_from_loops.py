"""Model endpoints' breaker rows move from ``loops_circuitstate`` (key ``model-endpoint:<name>``)
to ``agents_endpointcircuit``; the loops table keeps only pattern breakers."""

from typing import Any

from django.db import migrations

PREFIX = "model-endpoint:"
FIELDS = ("key", "state", "consecutive_failures", "opened_at", "cooldown_seconds", "probe_owner")


def move_to_agents(apps: Any, schema_editor: Any) -> None:
    old = apps.get_model("loops", "CircuitState").objects.filter(key__startswith=PREFIX)
    new = apps.get_model("agents", "EndpointCircuit")
    new.objects.bulk_create(
        [new(**{name: getattr(row, name) for name in FIELDS}) for row in old],
        ignore_conflicts=True,
    )
    old.delete()


def move_back(apps: Any, schema_editor: Any) -> None:
    new = apps.get_model("agents", "EndpointCircuit").objects.all()
    old = apps.get_model("loops", "CircuitState")
    old.objects.bulk_create(
        [old(**{name: getattr(row, name) for name in FIELDS}) for row in new],
        ignore_conflicts=True,
    )
    new.delete()


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0002_endpoint_circuit"),
        ("loops", "0006_fewer_indexes"),
    ]

    operations = [migrations.RunPython(move_to_agents, move_back)]
