"""Files a workload keeps on the server's disk: its uploaded workdir, an instance's disk, its logs."""
