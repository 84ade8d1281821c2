"""The operator UI's views, one module per area, each guarded by ``frontend.access.ui_view``."""
