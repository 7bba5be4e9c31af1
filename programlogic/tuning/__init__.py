"""Hyperparameter tuning as program logic (work in progress)."""
