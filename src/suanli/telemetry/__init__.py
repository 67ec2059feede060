"""Adapters that read GPU hardware: NVML discovery now, metrics later.

Kept apart from the control plane so that nothing else imports a vendor library, and so a host without
one still runs everything.
"""
