"""Serving models (pure): the endpoint spec, the runtime adapters that build a replica's command line, and the
autoscaler's decision. No I/O, no clock: the control plane (`control.serving.endpoints`, `control.serving.serving`) and
the gateway (`api.gateway`) call these."""
