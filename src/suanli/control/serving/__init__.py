"""Serving: serving models behind endpoints: endpoints and their replicas, the serving pass, the OpenAI gateway, per-
token charges between orgs."""
