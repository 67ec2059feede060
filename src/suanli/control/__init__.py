"""Services: the control plane's use-cases (accounts, money, inventory, offers, metering), recipes over the
database adapter and the pure core. Interfaces (API, CLI) call these; these never import interfaces."""
