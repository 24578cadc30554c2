"""Runbooks: playbook engine, built-in actions, incident reports."""
