"""Spans (issue 22): the stored span record of ended runs and each run's trace id.

Runs created before get a trace id each (a column default would give them all the same one).
"""

import django.db.models.deletion
from django.db import migrations, models

import loops.span_models


def distinct_trace_ids(apps, schema_editor):
    run_model = apps.get_model("loops", "LoopRun")
    for run_id in run_model.objects.values_list("id", flat=True).iterator(chunk_size=500):
        run_model.objects.filter(pk=run_id).update(trace_id=loops.span_models.new_trace_id())


class Migration(migrations.Migration):
    dependencies = [
        ("loops", "0011_approval_questions"),
    ]

    operations = [
        migrations.CreateModel(
            name="LoopSpanRecord",
            fields=[
                (
                    "run",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="span_record",
                        serialize=False,
                        to="loops.looprun",
                    ),
                ),
                ("recorded_at", models.DateTimeField()),
                ("spans", models.PositiveIntegerField(default=0)),
                ("exported", models.BooleanField(default=False)),
            ],
        ),
        migrations.AddField(
            model_name="looprun",
            name="trace_id",
            field=models.CharField(default=loops.span_models.new_trace_id, max_length=32),
        ),
        migrations.RunPython(distinct_trace_ids, migrations.RunPython.noop),
        migrations.CreateModel(
            name="LoopSpan",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("span_id", models.CharField(max_length=16)),
                ("parent_span_id", models.CharField(blank=True, default="", max_length=16)),
                ("kind", models.CharField(max_length=12)),
                ("name", models.CharField(max_length=200)),
                ("role", models.CharField(blank=True, default="", max_length=20)),
                ("invocation", models.CharField(blank=True, default="", max_length=100)),
                ("status", models.CharField(max_length=10)),
                ("error", models.TextField(blank=True, default="")),
                ("started_at", models.DateTimeField()),
                ("ended_at", models.DateTimeField(blank=True, null=True)),
                ("tokens_in", models.PositiveIntegerField(default=0)),
                ("tokens_out", models.PositiveIntegerField(default=0)),
                ("cost", models.DecimalField(decimal_places=6, default=0, max_digits=14)),
                ("model", models.CharField(blank=True, default="", max_length=200)),
                ("endpoint", models.CharField(blank=True, default="", max_length=200)),
                ("tier", models.CharField(blank=True, default="", max_length=10)),
                ("step_seq", models.PositiveIntegerField(blank=True, null=True)),
                ("attributes", models.JSONField(blank=True, default=dict)),
                ("expires_at", models.DateTimeField(db_index=True)),
                (
                    "run",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="spans",
                        to="loops.looprun",
                    ),
                ),
            ],
            options={
                "ordering": ["run", "started_at"],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("run", "span_id"), name="loops_span_run_span_unique"
                    )
                ],
            },
        ),
    ]
