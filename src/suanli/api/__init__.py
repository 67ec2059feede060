"""The HTTP interface: FastAPI routers over the control services, versioned under /api/v1."""
