"""Prompts: the shipped and uploaded prompt sets, chat templates, and what kind of token each output token is."""
