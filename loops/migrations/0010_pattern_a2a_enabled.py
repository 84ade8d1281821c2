from django.db import migrations, models


class Migration(migrations.Migration):
    """A pattern may be served as an A2A agent (``a2a_server``)."""

    dependencies = [
        ("loops", "0009_retire_lock_wait_since"),
    ]

    operations = [
        migrations.AddField(
            model_name="looppattern",
            name="a2a_enabled",
            field=models.BooleanField(default=False),
        ),
    ]
