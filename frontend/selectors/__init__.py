"""Read-only queries behind the UI's pages and live streams, one module per page family, named
as the views (``frontend.views.runs`` reads through ``frontend.selectors.runs``). Nothing here
writes."""
