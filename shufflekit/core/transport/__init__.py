"""Transports: one async publish/subscribe interface, in-memory and MQTT implementations."""

from shufflekit.core.transport.base import Message, Subscription, Transport, drain, topic_matches
from shufflekit.core.transport.memory import MemoryBroker, MemoryTransport
from shufflekit.core.transport.mqtt import BrokerAddress, MqttTransport

__all__ = [
    "BrokerAddress",
    "MemoryBroker",
    "MemoryTransport",
    "Message",
    "MqttTransport",
    "Subscription",
    "Transport",
    "drain",
    "topic_matches",
]
