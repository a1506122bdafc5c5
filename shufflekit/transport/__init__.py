"""Transports: one async publish/subscribe interface, in-memory and MQTT implementations."""

from shufflekit.transport.base import Message, Subscription, Transport, drain, topic_matches
from shufflekit.transport.memory import MemoryBroker, MemoryTransport
from shufflekit.transport.mqtt import BrokerAddress, MqttTransport

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
