"""Spark as the data half's production engine: the session from configuration, and a local cluster for tests."""
