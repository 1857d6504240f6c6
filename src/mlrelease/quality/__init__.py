"""Data-quality gates: Great Expectations suites, drift statistics and the HTML report."""
