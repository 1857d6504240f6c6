"""The release report: one HTML page per DAG run, with its plots, kept with the run's artifacts."""
