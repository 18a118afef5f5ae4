"""Live metrics for Prometheus.

The soak's and the worker's metrics, the bounded HTTP endpoint and the textfile.
"""
