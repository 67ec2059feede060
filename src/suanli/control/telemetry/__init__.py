"""Telemetry: GPU readings and what follows from them: stored samples and rollups, the telemetry loop, health
actions, what operators and tenants read."""
