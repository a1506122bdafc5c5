"""Long-running services (mix, analyzer, coordinator), their configuration, keys and clients."""
