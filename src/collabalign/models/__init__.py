"""Backbones (offline), the reward model, and (with the policy methods) the policy."""
