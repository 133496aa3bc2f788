"""Checkers of artifacts and environments.

Each reads what a stage produced and exits non-zero naming what is wrong.
"""
