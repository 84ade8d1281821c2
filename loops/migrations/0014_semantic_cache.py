import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("loops", "0013_instruction_versions"),
    ]

    operations = [
        migrations.CreateModel(
            name="SemanticCacheEntry",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("key", models.CharField(max_length=64)),
                ("embedding", models.BinaryField()),
                ("response", models.JSONField()),
                ("hits", models.PositiveIntegerField(default=0)),
                ("created_at", models.DateTimeField()),
                ("expires_at", models.DateTimeField()),
                (
                    "pattern",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="loops.looppattern",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(
                        fields=["pattern", "key", "expires_at"], name="loops_semcache_lookup"
                    ),
                    models.Index(fields=["expires_at"], name="loops_semcache_expiry"),
                ],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("expires_at__gt", models.F("created_at"))),
                        name="loops_semcache_expires_later",
                    )
                ],
            },
        ),
    ]
