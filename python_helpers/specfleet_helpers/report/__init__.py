"""The controller's fleet report."""
