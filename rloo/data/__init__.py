"""Prompts: the DataModule over HF datasets."""
