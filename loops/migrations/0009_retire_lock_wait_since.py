from django.db import migrations


class Migration(migrations.Migration):
    """A lock wait's start is in the run's wait record (``LoopRun.wait``) now."""

    dependencies = [
        ("loops", "0008_run_wait"),
    ]

    operations = [
        migrations.RemoveField(model_name="looprun", name="lock_wait_since"),
    ]
