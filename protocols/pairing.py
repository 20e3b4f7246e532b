"""Pairing over the light: laptops that share no key agree on one, and their people check it by eye.

A room that names no key pairs at start (wccl.distributed.pairing runs it over the ranks' collectives, in
frames nobody keys yet). Every rank draws an ephemeral X25519 key pair and a salt; then three collectives:

1. all_gather of commitments: `commitment(public, salt)`, a hash that binds a rank to its public key
   before it sees anyone else's;
2. all_gather of reveals: the public key and salt; each rank checks every reveal against its commitment
   (a screen that shows another rank's commitment and then a key of its own is named);
3. broadcast from rank 0 of the room key it drew, sealed to each other rank's public key (X25519, then
   ChaCha20-Poly1305 under a key hashed from the shared secret and the transcript).

Every rank then shows the same six digits (`code`, a hash of all commitments and reveals) on its screen
and console; the people at the table look at every screen and press a key on each laptop only if all show
the same digits. An intruder that put its own key in place of a rank's, towards one camera or all, changes
the transcript that some rank hashed: the digits differ, nobody confirms, no key. It cannot choose its key
so that the digits agree: it must commit before the rank it deceives reveals, so the chance is one in a
million. (The leader seals its key before anyone confirms: in a pairing nobody confirms, whoever took part
may hold that key, which is then thrown away, never used.)
A recorded pairing replayed in another run carries other run nonces (the handshake refuses its frames),
and its keys were sealed to private keys that never left their laptops.

Pure: the private keys, salts and the room key are passed in; no I/O, no clock, no randomness.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

KEY_BYTES = 32  # a room key, an X25519 key
SALT_BYTES = 16
COMMIT_BYTES = 32
REVEAL_BYTES = KEY_BYTES + SALT_BYTES
SEALED_BYTES = KEY_BYTES + 16  # a room key and its Poly1305 tag
CODE_DIGITS = 6
LEADER = 0  # the rank that draws the room key


class PairingError(ValueError):
    """Pairing cannot give a key: the words say why (a reveal that does not match, a key that does not
    open, digits that the people at the table saw differ)."""


def _hash(person: bytes, *parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=32, person=person)
    for p in parts:
        h.update(len(p).to_bytes(4, "big"))
        h.update(p)
    return h.digest()


def commitment(public: bytes, salt: bytes) -> bytes:
    """What a rank shows first: a hash binding its public key and salt, which it shows next."""
    return _hash(b"wccl-pair-commit", public, salt)


@dataclass
class Pairing:
    """One rank's side of a pairing among `world` ranks (rank LEADER draws the room key)."""

    rank: int
    world: int
    private: bytes  # 32 random bytes: this rank's X25519 private key for this pairing only
    salt: bytes  # SALT_BYTES random bytes
    room_key: bytes | None = None  # the leader's: KEY_BYTES random bytes (the others learn it)
    names: tuple[str, ...] = ()  # the ranks' names, for the errors
    transcript: bytes = field(default=b"", init=False)
    code: str = field(default="", init=False)  # the six digits every screen shows, "482 913"

    def __post_init__(self) -> None:
        if not 2 <= self.world <= 255 or not 0 <= self.rank < self.world:
            raise ValueError(f"pairing: rank {self.rank} of {self.world}")
        if len(self.private) != KEY_BYTES or len(self.salt) != SALT_BYTES:
            raise ValueError("pairing: a private key of 32 bytes and a salt of 16")
        if (self.rank == LEADER) != (self.room_key is not None) or (
                self.room_key is not None and len(self.room_key) != KEY_BYTES):
            raise ValueError("pairing: the leader, and only the leader, brings a room key of 32 bytes")
        self._key = X25519PrivateKey.from_private_bytes(self.private)
        self.public = self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self._reveals: list[bytes] = []

    def _name(self, r: int) -> str:
        return self.names[r] if r < len(self.names) else f"rank {r}"

    def commitment(self) -> bytes:
        return commitment(self.public, self.salt)

    def reveal(self) -> bytes:
        return self.public + self.salt

    def take(self, commitments: list[bytes], reveals: list[bytes]) -> str:
        """Every rank's commitment and reveal, in rank order: check each reveal against its commitment, and
        return the code the people compare. Raises PairingError naming a rank whose reveal does not match
        (or whose slot holds this rank's own values changed: another screen spoke as it)."""
        if len(commitments) != self.world or len(reveals) != self.world:
            raise PairingError(f"pairing: {len(commitments)} commitments and {len(reveals)} reveals for "
                               f"{self.world} ranks")
        for r, (c, v) in enumerate(zip(commitments, reveals)):
            if len(c) != COMMIT_BYTES or len(v) != REVEAL_BYTES or commitment(v[:KEY_BYTES], v[KEY_BYTES:]) != c:
                raise PairingError(f"pairing: {self._name(r)}'s key does not match what {self._name(r)} "
                                   "committed to: another screen is speaking as it")
        if commitments[self.rank] != self.commitment() or reveals[self.rank] != self.reveal():
            raise PairingError(f"pairing: the room read another key as {self._name(self.rank)}'s (this "
                               "laptop's): another screen is speaking as it")
        self._reveals = list(reveals)
        self.transcript = _hash(b"wccl-pair-trans", *commitments, *reveals)
        n = int.from_bytes(_hash(b"wccl-pair-code", self.transcript)[:8], "big") % 10 ** CODE_DIGITS
        digits = f"{n:0{CODE_DIGITS}d}"
        self.code = f"{digits[:3]} {digits[3:]}"
        return self.code

    def _wrap_key(self, peer: int) -> ChaCha20Poly1305:
        public = X25519PublicKey.from_public_bytes(self._reveals[peer][:KEY_BYTES])
        try:
            shared = self._key.exchange(public)
        except ValueError:  # a low-order point (all zeros, say): no secret to share
            raise PairingError(f"pairing: {self._name(peer)}'s key is not one a laptop draws: another screen is "
                               "speaking as it") from None
        low, high = sorted((self.rank, peer))
        return ChaCha20Poly1305(_hash(b"wccl-pair-wrap", shared, self.transcript, bytes([low, high])))

    def sealed(self) -> bytes:
        """The leader's broadcast: the room key sealed to each other rank in turn (SEALED_BYTES each)."""
        if self.room_key is None or not self.transcript:
            raise ValueError("pairing: only the leader seals, after the reveals")
        return b"".join(self._wrap_key(r).encrypt(bytes(12), self.room_key, self.transcript)
                        for r in range(self.world) if r != LEADER)

    def open(self, sealed: bytes) -> bytes:
        """The room key from the leader's broadcast (the leader's own, on the leader)."""
        if self.rank == LEADER:
            return self.room_key
        if not self.transcript:
            raise ValueError("pairing: open after the reveals")
        if len(sealed) != SEALED_BYTES * (self.world - 1):
            raise PairingError(f"pairing: {self._name(LEADER)}'s sealed keys are {len(sealed)} bytes, not "
                               f"{SEALED_BYTES * (self.world - 1)}")
        slot = self.rank - 1 if self.rank > LEADER else self.rank
        try:
            return self._wrap_key(LEADER).decrypt(bytes(12), sealed[slot * SEALED_BYTES:(slot + 1) * SEALED_BYTES],
                                                  self.transcript)
        except InvalidTag:
            raise PairingError(f"pairing: the room key {self._name(LEADER)} sealed for this laptop does not "
                               "open: its screen and this one saw different keys") from None
