"""Binary wire formats: the fixed-size versioned report, the mix-0 ingest envelope, batch chunks.

No pickle on the wire. Every parser checks version and length before touching content and
raises `InvalidReport` with a counter name, so services can count rejections by reason.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from shufflekit.base.errors import InternalError, InvalidInput, InvalidReport

REPORT_VERSION = 1
RANDOMIZER_KRR = 1
RANDOMIZER_BITS = 2  # bit-vector records: the k field holds L, the value field the L bits
_REPORT = struct.Struct(">BBHH")  # version, randomizer, k (or L), value (or record)
REPORT_SIZE = _REPORT.size
MAX_RECORD_BITS = 16  # an L-bit record fits the 2-byte value field: same 6 bytes as k-RR

ENVELOPE_VERSION = 1
ENVELOPE_VERSION_CREDENTIAL = 2  # adds the round id and the client's credential
ENVELOPE_VERSION_REPLY = 3  # adds the reply id: mix 0 answers there with a signed receipt
MAX_CLIENT_ID = 64
MAX_ROUND_ID = 64
MAX_CREDENTIAL = 160  # the proof of core/credentials.py (PROOF_SIZE)
MAX_REPLY = 64

CHUNK_VERSION = 1
_CHUNK = struct.Struct(">BBIII")  # version, hop, chunk index, item size, item count
MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # the largest payload a hop sends (a forwarded chunk)
# the largest MQTT packet a service accepts (declared to the broker) and the shipped broker's
# max_packet_size: a chunk of MAX_MESSAGE_BYTES plus room for its topic and properties
MAX_PACKET_BYTES = MAX_MESSAGE_BYTES + 64 * 1024


@dataclass(frozen=True)
class Report:
    """The innermost plaintext a client sends: one randomized value of a k-RR round."""

    k: int
    value: int

    def encode(self) -> bytes:
        """Fixed-size encoding (6 bytes) so that ciphertexts do not leak the value by length."""
        if not 2 <= self.k <= 0xFFFF or not 0 <= self.value < self.k:
            raise InvalidInput(f"report value {self.value} outside [0, {self.k})")
        return _REPORT.pack(REPORT_VERSION, RANDOMIZER_KRR, self.k, self.value)

    @classmethod
    def decode(cls, data: bytes, expected_k: int) -> Report:
        """Parse and validate one report against the round's k."""
        k, value = _unpack(data, RANDOMIZER_KRR, "k-RR")
        if k != expected_k:
            raise InvalidReport("bad_k", f"report for k={k}, round has k={expected_k}")
        if value >= k:
            raise InvalidReport("bad_value", f"report value {value} outside [0, {k})")
        return cls(k=k, value=value)


def _unpack(data: bytes, randomizer: int, kind: str) -> tuple[int, int]:
    """The size field (k or L) and value of a report, after the checks every randomizer
    shares: length, version, and that the report is of this round's randomizer."""
    if len(data) != REPORT_SIZE:
        raise InvalidReport("bad_length", f"report is {len(data)} bytes, expected {REPORT_SIZE}")
    version, got, size, value = _REPORT.unpack(data)
    if version != REPORT_VERSION:
        raise InvalidReport("bad_version", f"report version {version}, expected {REPORT_VERSION}")
    if got != randomizer:
        raise InvalidReport("bad_randomizer", f"randomizer id {got} in a {kind} round")
    return size, value


@dataclass(frozen=True)
class BitsReport:
    """The innermost plaintext of a bit-vector round: one randomized L-bit record (bit j of
    the record is bit j of `record`, least significant first).

    It has the k-RR report's layout and size (6 bytes), so onions, mixes and batches are
    unchanged and every report of any round has the same length on the wire.
    """

    bits: int
    record: int

    def encode(self) -> bytes:
        """Fixed-size encoding: version, RANDOMIZER_BITS, L, record."""
        if not 1 <= self.bits <= MAX_RECORD_BITS or not 0 <= self.record < (1 << self.bits):
            raise InvalidInput(f"record {self.record} is not a {self.bits}-bit record")
        return _REPORT.pack(REPORT_VERSION, RANDOMIZER_BITS, self.bits, self.record)

    @classmethod
    def decode(cls, data: bytes, expected_bits: int) -> BitsReport:
        """Parse and validate one report against the round's L."""
        bits, record = _unpack(data, RANDOMIZER_BITS, "bits")
        if bits != expected_bits:
            raise InvalidReport("bad_bits", f"report has L={bits}, round has L={expected_bits}")
        if record >= (1 << bits):
            raise InvalidReport("bad_value", f"record {record} has more than {bits} bits")
        return cls(bits=bits, record=record)


def encode_report(mechanism: str, size: int, value: int) -> bytes:
    """A round's report: k-RR value (`size` = k) or bit record (`size` = L), 6 bytes either way."""
    if mechanism == "bits":
        return BitsReport(bits=size, record=value).encode()
    return Report(k=size, value=value).encode()


def decode_report(data: bytes, mechanism: str, size: int) -> int:
    """The value (k-RR) or record (bits) of one report, validated against the round."""
    if mechanism == "bits":
        return BitsReport.decode(data, size).record
    return Report.decode(data, size).value


@dataclass(frozen=True)
class Envelope:
    """What a client publishes to mix 0: its identity (seen only by mix 0) and the onion.

    Version 1 carries the client id and the onion. Version 2 (used when `round_id` is set) also
    names the round and carries the client's proof (core/credentials.py), both outside
    the onion: mix 0 checks them and forwards only the peeled onion. Version 3 (`reply` set)
    adds the reply id under which mix 0 sends the report's receipt (core/receipts.py).
    """

    client_id: str
    onion: bytes
    credential: bytes | None = None
    round_id: str | None = None
    reply: str | None = None

    def encode(self) -> bytes:
        """v1: version | id length | id (ASCII) | onion.
        v2: version | id length | id | round length | round | credential length | credential |
        onion. v3: as v2, then reply length | reply, then the onion."""
        cid = self.client_id.encode("ascii")
        if not 1 <= len(cid) <= MAX_CLIENT_ID:
            raise InvalidInput(f"client id must be 1..{MAX_CLIENT_ID} ASCII bytes")
        if self.round_id is None:
            if self.credential is not None or self.reply is not None:
                raise InvalidInput("an envelope with a credential or a reply must name its round")
            return bytes([ENVELOPE_VERSION, len(cid)]) + cid + self.onion
        rid = self.round_id.encode("ascii")
        cred = self.credential or b""
        if not 1 <= len(rid) <= MAX_ROUND_ID or len(cred) > MAX_CREDENTIAL:
            raise InvalidInput("round id or credential too long for an envelope")
        version = ENVELOPE_VERSION_CREDENTIAL if self.reply is None else ENVELOPE_VERSION_REPLY
        head = bytes([version, len(cid)]) + cid + bytes([len(rid)]) + rid
        head += bytes([len(cred)]) + cred
        if self.reply is not None:
            reply = self.reply.encode("ascii")
            if not 1 <= len(reply) <= MAX_REPLY:
                raise InvalidInput(f"reply id must be 1..{MAX_REPLY} ASCII bytes")
            head += bytes([len(reply)]) + reply
        return head + self.onion

    @staticmethod
    def max_size(onion_size: int) -> int:
        """The largest envelope around an onion of `onion_size` bytes; beyond it: `oversized`."""
        return 5 + MAX_CLIENT_ID + MAX_ROUND_ID + MAX_CREDENTIAL + MAX_REPLY + onion_size

    @classmethod
    def decode(cls, data: bytes, onion_size: int) -> Envelope:
        """Parse and check the envelope; the onion must have the round's exact size."""
        if len(data) > cls.max_size(onion_size):
            raise InvalidReport("oversized", f"envelope of {len(data)} bytes")
        if len(data) < 2:
            raise InvalidReport("malformed", "envelope shorter than its header")
        if data[0] not in (ENVELOPE_VERSION, ENVELOPE_VERSION_CREDENTIAL, ENVELOPE_VERSION_REPLY):
            raise InvalidReport("bad_version", f"envelope version {data[0]}")
        cid_bytes, pos = _field(data, 1, MAX_CLIENT_ID, "client id")
        cid = _ascii(cid_bytes, "client id")
        round_id: str | None = None
        credential: bytes | None = None
        reply: str | None = None
        if data[0] != ENVELOPE_VERSION:
            rid, pos = _field(data, pos, MAX_ROUND_ID, "round id")
            round_id = _ascii(rid, "round id")
            cred, pos = _field(data, pos, MAX_CREDENTIAL, "credential", minimum=0)
            credential = cred or None
        if data[0] == ENVELOPE_VERSION_REPLY:
            raw_reply, pos = _field(data, pos, MAX_REPLY, "reply id")
            reply = _ascii(raw_reply, "reply id")
        onion = data[pos:]
        if len(onion) != onion_size:
            raise InvalidReport(
                "bad_length", f"onion is {len(onion)} bytes, this round expects {onion_size}"
            )
        return cls(cid, onion, credential=credential, round_id=round_id, reply=reply)


def _field(
    data: bytes, pos: int, maximum: int, what: str, *, minimum: int = 1
) -> tuple[bytes, int]:
    """A length-prefixed field at `pos`: its bytes and the position after it."""
    if pos >= len(data):
        raise InvalidReport("malformed", f"envelope ends before its {what}")
    n = data[pos]
    if not minimum <= n <= maximum or len(data) < pos + 1 + n:
        raise InvalidReport("malformed", f"envelope {what} length is invalid")
    return data[pos + 1 : pos + 1 + n], pos + 1 + n


def _ascii(raw: bytes, what: str) -> str:
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        raise InvalidReport("malformed", f"{what} is not ASCII") from None


@dataclass(frozen=True)
class Chunk:
    """A slice of a permuted batch travelling from one hop to the next: fixed-size items."""

    hop: int
    index: int
    items: tuple[bytes, ...]

    def encode(self, item_size: int) -> bytes:
        """Header then the concatenated items; every item must have `item_size` bytes."""
        if any(len(it) != item_size for it in self.items):
            raise InternalError("all items of a chunk must have the same size")
        head = _CHUNK.pack(CHUNK_VERSION, self.hop, self.index, item_size, len(self.items))
        return head + b"".join(self.items)

    @classmethod
    def decode(cls, data: bytes, expected_hop: int, item_size: int) -> Chunk:
        """Parse a chunk addressed to hop `expected_hop` with items of `item_size` bytes."""
        if len(data) < _CHUNK.size:
            raise InvalidReport("malformed", "chunk shorter than its header")
        version, hop, index, size, count = _CHUNK.unpack_from(data)
        if version != CHUNK_VERSION:
            raise InvalidReport("bad_version", f"chunk version {version}")
        if hop != expected_hop:
            raise InvalidReport("wrong_hop", f"chunk for hop {hop} arrived at hop {expected_hop}")
        if size != item_size or len(data) != _CHUNK.size + size * count:
            raise InvalidReport("bad_length", "chunk length does not match its header")
        body = data[_CHUNK.size :]
        items = tuple(body[i * size : (i + 1) * size] for i in range(count))
        return cls(hop=hop, index=index, items=items)


def split_chunks(items: Sequence[bytes], hop: int, per_chunk: int) -> list[Chunk]:
    """Cut a permuted batch into chunks of at most `per_chunk` items, keeping its order; fewer
    if that many would make a chunk larger than MAX_MESSAGE_BYTES (the broker's limit)."""
    if items:
        per_chunk = max(1, min(per_chunk, (MAX_MESSAGE_BYTES - _CHUNK.size) // len(items[0])))
    return [
        Chunk(hop=hop, index=i, items=tuple(items[s : s + per_chunk]))
        for i, s in enumerate(range(0, len(items), per_chunk))
    ]


def batch_digest(items: Iterable[bytes]) -> str:
    """SHA-256 over the batch in order; the manifest carries it so the next hop can verify."""
    h = hashlib.sha256()
    for it in items:
        h.update(it)
    return h.hexdigest()
