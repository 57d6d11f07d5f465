"""Benchmarks: each prints ratios against a slow reference measured in the same run, and writes JSON."""
