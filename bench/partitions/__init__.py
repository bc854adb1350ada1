"""How big a telemetry partition should be: `python -m bench.partitions` (see __main__)."""
