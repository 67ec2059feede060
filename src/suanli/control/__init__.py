"""Services: the control plane's use-cases, one package per domain (`accounts`, `money`, `scheduling`, `serving`,
`storage`, `telemetry`, `workloads`), recipes over the database adapter and the pure core; what every domain
shares (settings, errors, ids and the clock, caches, leases, the background loops) stays here. Interfaces (API,
CLI) call these; these never import interfaces."""
