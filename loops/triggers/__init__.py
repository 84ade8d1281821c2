"""Triggers: cron arithmetic and the scheduler tick, event intake, and trigger refusals."""
