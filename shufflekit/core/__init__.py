"""The shared core of every role: wire formats, the HPKE onion and key text, control messages,
topics, credentials, transports (memory and MQTT), the spool, batch transfer and the hop frame."""
