"""telemetry."""
