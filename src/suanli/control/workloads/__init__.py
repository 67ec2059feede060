"""Workloads: a tenant's work from submission to its end: submit and describe, launch and supervise, resize, logs,
sandboxes, and reaching a running instance through the browser proxy or the SSH gateway."""
