"""Long-running services (mix, analyzer, coordinator), their configuration, keys and clients.

Kept import-light: the component packages import `shufflekit.services.shutdown`.
"""
