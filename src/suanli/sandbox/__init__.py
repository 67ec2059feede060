"""Tenant sandboxes: bubblewrap namespaces, mounts and device nodes (`bwrap`), cgroup or rlimit limits (`limits`),
and entering a live sandbox (`join`). Adapters: they run host tools; the executors' launcher calls them."""
