"""The shared core of every role: wire formats, the HPKE onion, control messages, topics,
credentials, transports (memory and MQTT), the spool and batch transfer."""
