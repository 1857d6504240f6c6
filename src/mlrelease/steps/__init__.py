"""Pipeline steps: each is one `mlrelease step <name>` command that a pod (or a local process) runs."""
