"""Users, roles and API tokens."""
