"""Federated and personalised methods built on the federation protocol."""
