"""Storage: data kept on the server's disk for tenants: workdir uploads, storage quotas and their sweep, volumes, the
hub of models and datasets."""
