"""specfleet host-side helpers."""
