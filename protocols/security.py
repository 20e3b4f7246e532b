"""The room key: who may speak and read in the room (frame MACs, payload encryption, run handshake).

Every laptop of a room holds the same 32-byte secret (a key file made by
`python -m wccl.keys new`, or a passphrase stretched with scrypt). From it,
separate subkeys:

- `mac`: every frame's 8-byte check is a keyed BLAKE2b of its header and
  packet (in place of the unkeyed hash: no byte more per frame). Without
  the key nobody can make a frame a node accepts; a flipped bit anywhere
  fails the check.
- `aead`: a transfer's tensor bytes are sealed with ChaCha20-Poly1305
  before they are fountain coded (16 bytes of tag per transfer, not per
  frame). The nonce is (the sender's run nonce: 8 random bytes drawn when
  its node starts, transfer number: 4 bytes), so no nonce ever repeats
  under a key; the associated data binds the transfer's header (session,
  sender, transfer, collective, op, dtype, size, part).
- `checkpoint`: a checkpoint file's tag (wccl.runtime.recovery).

Freshness (`Handshake`): a frame filmed in one run and shown in another
carries a valid MAC, so the MAC alone cannot refuse it. Each node draws a
random run nonce at start and puts it in every frame; its status frames
also echo the nonce it last saw of each peer. A node accepts a peer's
transfers and acknowledgements only under the nonce that peer showed in a
frame echoing this node's own current nonce: proof that the frame was made
in this run, after this node started. Replayed frames of another run carry
another nonce and are refused; replays within the run are refused by the
time window (their `shown_us` is older than the sender's latest by more
than `REPLAY_WINDOW_S`) or are duplicates of packets already used. A peer
that starts again (a new process, a new nonce) is trusted under its new
nonce once a frame of it echoes this node's current nonce; its old nonce is
retired (its frames refused as another run's from then on).

Without a key (`RoomKey(None)`), checks are unkeyed hashes (anyone can
forge them), payloads travel in the clear, and the handshake still refuses
other runs' frames. Pure: no I/O, no asyncio.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

KEY_BYTES = 32
CHECK_BYTES = 8
TAG_BYTES = 16
SCRYPT = dict(n=2 ** 15, r=8, p=1, maxmem=64 * 2 ** 20)  # ~32 MiB and ~0.1 s a derivation
SCRYPT_SALT = b"wccl room key v1"
REPLAY_WINDOW_S = 20.0


class KeyError_(ValueError):
    """A room key that cannot be used (wrong size, missing file or variable)."""


@dataclass(frozen=True)
class RoomKey:
    """A room's secret (None: no key, frames unauthenticated) and the subkeys made from it."""

    secret: bytes | None = None
    source: str = "none"
    _subkeys: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.secret is not None and len(self.secret) != KEY_BYTES:
            raise KeyError_(f"a room key is {KEY_BYTES} bytes, this one is {len(self.secret)}")

    @property
    def authenticated(self) -> bool:
        return self.secret is not None

    @property
    def encrypts(self) -> bool:
        return self.secret is not None

    @property
    def fingerprint(self) -> str:
        """8 hex digits that tell two laptops' keys apart without showing them ('none' without a key)."""
        if self.secret is None:
            return "none"
        return hashlib.blake2b(self.secret, digest_size=4, person=b"wccl-fingerprt").hexdigest()

    def subkey(self, purpose: str) -> bytes:
        if self.secret is None:
            return b""
        k = self._subkeys.get(purpose)
        if k is None:
            k = self._subkeys[purpose] = hashlib.blake2b(purpose.encode(), digest_size=KEY_BYTES, key=self.secret,
                                                         person=b"wccl-subkey").digest()
        return k

    def check(self, data: bytes, person: bytes) -> bytes:
        """The 8-byte check of a frame: keyed BLAKE2b (an unkeyed hash without a room key)."""
        return hashlib.blake2b(data, digest_size=CHECK_BYTES, key=self.subkey("mac"), person=person).digest()

    def verify(self, data: bytes, person: bytes, check: bytes) -> bool:
        return hmac.compare_digest(self.check(data, person), bytes(check))

    # ---- payloads ------------------------------------------------------------------------------

    @property
    def overhead(self) -> int:
        """Bytes a sealed payload adds (the AEAD tag; 0 without a key)."""
        return TAG_BYTES if self.encrypts else 0

    def _aead(self) -> ChaCha20Poly1305:
        a = self._subkeys.get("_aead")
        if a is None:
            a = self._subkeys["_aead"] = ChaCha20Poly1305(self.subkey("aead"))
        return a

    def seal(self, run_nonce: int, tid: int, data: bytes, aad: bytes) -> bytes:
        if not self.encrypts:
            return data
        return self._aead().encrypt(payload_nonce(run_nonce, tid), data, aad)

    def open(self, run_nonce: int, tid: int, data: bytes, aad: bytes) -> bytes | None:
        """The payload, or None if it was not sealed under this key, nonce and header."""
        if not self.encrypts:
            return data
        try:
            return self._aead().decrypt(payload_nonce(run_nonce, tid), data, aad)
        except InvalidTag:
            return None

    def tag(self, data: bytes, person: bytes) -> bytes:
        """A 32-byte keyed tag of a file's contents (checkpoints); unkeyed without a room key."""
        return hashlib.blake2b(data, digest_size=32, key=self.subkey("file"), person=person).digest()


NO_KEY = RoomKey(None)


def payload_nonce(run_nonce: int, tid: int) -> bytes:
    """The 12-byte AEAD nonce of transfer `tid` of a sender whose run nonce is `run_nonce`."""
    return run_nonce.to_bytes(8, "big") + tid.to_bytes(4, "big")


def key_from_passphrase(passphrase: str) -> bytes:
    """A 32-byte room key from a passphrase (scrypt: memory-hard, so guessing is slow)."""
    if not passphrase:
        raise KeyError_("the passphrase is empty")
    return hashlib.scrypt(passphrase.encode(), salt=SCRYPT_SALT, dklen=KEY_BYTES, **SCRYPT)


# ---- freshness --------------------------------------------------------------------------------


@dataclass
class Handshake:
    """Which run nonce of each peer this node trusts, the echo it shows them, and the replay window.

    `heard(sender, nonce, echo, trusts, shown_us, rows)`: a frame from `sender` (its MAC verified) with its
    run nonce, in a status frame its echo table (the nonce it last saw of each rank; None in other frames)
    and its discovery table (protocols.discovery rows; None in other frames), the ranks it trusts (a
    bitmask) and when it was shown (the sender's clock). Returns None if the frame belongs to this run and
    is recent, else why not: `unconfirmed_sender` (no nonce of this sender is proven fresh yet: at
    start-up, its echo of our nonce has not arrived), `other_run` (a nonce other than the proven one: a
    frame of another run, or of an earlier incarnation of the sender) or `replayed_old` (shown more than
    `window_s` before the sender's latest frame).

    Echoes are relayed: for a rank this camera does not read, the echo shows the nonce the peers' echoes
    carry (a trusted peer's wins), so in a room where each camera sees one screen a rank's nonce still
    goes round to the rank that must prove it has seen it. A relayed nonce proves nothing by itself: a
    peer is trusted only when its own frame echoes this node's current nonce, which no recording has.

    New incarnations: a peer that starts again (a new process: a new run nonce, its transfers numbered
    from 1 again) is trusted under its new nonce as soon as a frame of it echoes this node's current
    nonce; the nonce it replaces is *retired* (`retired`: its frames are refused as `other_run` from then
    on, never trusted again) and the peer's trust in this node is learnt anew (`trusted_by`). The caller
    (protocols.receiver) forgets the old incarnation's transfers. Before that proof, a status frame of a
    trusted peer under another nonce whose echo could be of this run (it echoes that nonce for the peer
    itself, 0 or this node's current nonce for this node, and for every other rank 0 or a nonce known
    here: a recording of another run echoes nonces nobody runs any more) is `newer`: this node echoes the
    new nonce (so that it goes round the room) and greets. Once discovery is done, a new incarnation noticed
    here, directly or in a trusted peer's echo, is `renewed` until its own row of the new incarnation
    arrives (for a rank this camera reads: a frame of the new incarnation whose own row is FINAL, i.e. it
    took the room's table; for the others: a newer version of its row); meanwhile this node greets, does
    not count the rank in its trust mask, and does not count that rank's row as trusting it. The newcomer
    itself takes the room's table (protocols.discovery.SightTable.relay) and does not count the rows it
    took as trusting it (`stale_rows`) until newer versions of them arrive: those ranks publish them once
    they trust its new nonce. A rank's row is taken from a peer's table only if the peer echoes the same
    nonce for that rank as this node (or one of them knows none), so a new incarnation's row never arrives
    ahead of its nonce. Once a new incarnation is settled, echoes of the nonce it replaced are ignored. A
    false alarm (the trusted nonce heard again before the new one is proven; every trusted peer echoing
    the replaced nonce again) is forgotten.

    With a `sight` table (protocols.discovery), the handshake is complete when every rank agrees on which
    camera reads which screen (and on the room's members: the room may start without a rank), this node
    trusts every peer it reads and every peer that reads it trusts it; without one (every camera reads
    every screen), when every pair trusts each other.
    """

    rank: int
    world: int
    nonce: int  # this run's, random, never 0 (wccl.keys.new_run_nonce)
    window_s: float = REPLAY_WINDOW_S
    trusted: dict[int, int] = field(default_factory=dict)  # peer -> its run nonce, proven fresh
    seen: dict[int, int] = field(default_factory=dict)  # peer not yet trusted -> the latest nonce heard (not proven)
    relayed: dict[int, int] = field(default_factory=dict)  # rank not read here -> nonce from peers' echoes
    trusted_by: set[int] = field(default_factory=set)  # peers whose fresh frames say they trust us
    latest_us: dict[int, int] = field(default_factory=dict)  # peer -> newest shown_us of a fresh frame
    on_complete: list = field(default_factory=list)  # called (no arguments) each time it becomes complete
    sight: object = None  # protocols.discovery.SightTable, or None: every camera reads every screen
    retired: dict[int, set[int]] = field(default_factory=dict)  # peer -> nonces of its earlier incarnations
    newer: dict[int, int] = field(default_factory=dict)  # trusted peer -> a new nonce heard of it, not proven yet
    # rank -> (version of its row, the nonce it replaced, read here) when its new incarnation was noticed
    renewed: dict[int, tuple[int, int, bool]] = field(default_factory=dict)
    stale_rows: dict[int, int] = field(default_factory=dict)  # rank -> version of its row taken, trusts not counted
    restarts: dict[int, int] = field(default_factory=dict)  # peer -> new incarnations trusted
    _echoed: dict[int, dict[int, int]] = field(default_factory=dict)  # rank not read -> trusted peer -> its echo

    def heard(self, sender: int, nonce: int, echo: tuple[int, ...] | None, trusts: int,
              shown_us: int, rows=None, layout: int = 0, margin: float = 1.0) -> str | None:
        if nonce in self.retired.get(sender, ()):
            return "other_run"  # an earlier incarnation of this peer: a newer one was proven fresh since
        was = self.complete
        old = self.trusted.get(sender)
        proven = echo is not None and self.rank < len(echo) and echo[self.rank] == self.nonce
        if proven and old != nonce:
            if old is not None:
                self._new_incarnation(sender, old)
            self.trusted[sender] = nonce  # proven: it saw our nonce, so it was made in this run
            self.latest_us.pop(sender, None)
        elif old is None:
            self.seen[sender] = nonce
        elif nonce != old:
            if echo is not None and self.newer.get(sender) != nonce and self._plausible(sender, nonce, echo):
                self.newer[sender] = nonce  # a new incarnation, perhaps: echo it, greet until it proves itself
                self._notice(sender, old, direct=True)
        elif sender in self.newer:
            # Its trusted nonce again: the other one was no new incarnation (this one still runs).
            del self.newer[sender]
            if self.renewed.get(sender, (0, 0, False))[1] == old:
                del self.renewed[sender]
        if echo is not None:
            self._relay_echo(sender, nonce, echo)
        if sender not in self.trusted:
            return "unconfirmed_sender"  # normal at start-up: its echo of our nonce has not arrived yet
        if self.trusted[sender] != nonce:
            return "other_run"
        latest = self.latest_us.get(sender)
        if latest is not None and shown_us < latest - self.window_s * 1e6:
            return "replayed_old"
        self.latest_us[sender] = max(shown_us, latest if latest is not None else shown_us)
        if trusts >> self.rank & 1:
            self.trusted_by.add(sender)
        else:
            self.trusted_by.discard(sender)
        if self.sight is not None:
            self.sight.accepted(sender, shown_us, layout, margin)
            if rows is not None:
                adopted = self.sight.adopted
                self.sight.relay(self._same_incarnations(sender, echo, rows))
                if self.sight.adopted != adopted:
                    # This node took the room's table: the rows it took say whom the ranks trusted before
                    # this incarnation started. Those of its readers count again once newer ones arrive.
                    self.stale_rows = {q: self.sight.rows[q].version for q in range(self.world)
                                       if q != self.rank and self.sight.reads(q, self.rank)}
            self._settle(sender, rows)
        self._fire(was)
        return None

    def _new_incarnation(self, sender: int, old: int) -> None:
        """`sender` proved a new nonce: its old one is retired, its trust in this node is learnt anew."""
        self.retired.setdefault(sender, set()).add(old)
        self.newer.pop(sender, None)
        self.trusted_by.discard(sender)
        self.restarts[sender] = self.restarts.get(sender, 0) + 1
        self._notice(sender, old, direct=True)

    def _notice(self, r: int, old: int, direct: bool) -> None:
        """A new incarnation of rank `r` (replacing nonce `old`) was noticed: once discovery is done, this
        node greets until that incarnation's own row arrives (`renewed`)."""
        st = self.sight
        if st is None or not st.known:
            return  # at start-up everyone greets anyway, and rows of a new incarnation replace the old
        prev = self.renewed.get(r)
        if prev is None or (direct and not prev[2]):
            self.renewed[r] = (prev[0] if prev else st.rows[r].version, old, direct)

    def _settle(self, sender: int, rows) -> None:
        """Forget the new incarnations whose own rows arrived, and the stale rows replaced by newer ones."""
        st = self.sight
        for r, (version, old, direct) in list(self.renewed.items()):
            if direct:
                done = (sender == r and rows is not None and rows[r].final and r not in self.newer
                        and self.trusted.get(r) not in (None, old))
            else:
                done = _newer_version(st.rows[r].version, version)
                if done:
                    self.retired.setdefault(r, set()).add(old)  # lagging echoes of it are not news any more
            if done:
                del self.renewed[r]
                if direct:
                    # This node trusts the new incarnation now: a new version of its row says so, made after
                    # the newcomer took the room's table (its trusts count there only from such a version).
                    st.touch()
        for q, version in list(self.stale_rows.items()):
            if _newer_version(st.rows[q].version, version):
                del self.stale_rows[q]

    def _same_incarnations(self, sender: int, echo: tuple[int, ...] | None, rows: tuple) -> tuple:
        """The rows of a trusted sender's table this node may take: a rank's row only if the sender echoes
        the same nonce for it as this node (or one of them knows none), so a row of a new incarnation
        reaches a rank only along with its nonce, and one of an old incarnation never replaces it."""
        if echo is None:
            return rows
        mine = self.echo()
        return tuple(row if r >= self.world or r in (sender, self.rank) or not echo[r] or not mine[r]
                     or echo[r] == mine[r] else type(row)() for r, row in enumerate(rows))

    def _plausible(self, sender: int, nonce: int, echo: tuple[int, ...]) -> bool:
        """Could this status frame be of a new incarnation of `sender`, in this run? (See the class
        docstring; only a frame that echoes this node's current nonce proves it.)"""
        if len(echo) < self.world or echo[sender] != nonce:
            return False
        for r in range(self.world):
            v = echo[r]
            if r == sender or not v:
                continue
            if r == self.rank:
                if v != self.nonce:
                    return False
            elif v not in (self.trusted.get(r), self.seen.get(r), self.relayed.get(r), self.newer.get(r)):
                return False
        return True

    def _relay_echo(self, sender: int, nonce: int, echo: tuple[int, ...]) -> None:
        trusted = self.trusted.get(sender) == nonce
        for r, v in enumerate(echo[:self.world]):
            if r in (self.rank, sender) or not v or r in self.trusted or r in self.seen or v in self.retired.get(r, ()):
                continue
            if trusted:
                self._echoed.setdefault(r, {})[sender] = v
            was = self.renewed.get(r)
            if was is not None and not was[2]:
                if all(e == was[1] for e in self._echoed.get(r, {}).values()):
                    # Every trusted peer echoes the nonce it replaced again: no new incarnation after all.
                    del self.renewed[r]
                    self.relayed[r] = was[1]
                    continue
                if v == was[1]:
                    continue  # a peer that has not heard of the new incarnation yet: keep echoing the new one
            if trusted or r not in self.relayed:
                old = self.relayed.get(r)
                if trusted and old and old != v:
                    self._notice(r, old, direct=False)
                self.relayed[r] = v
        if self.sight is not None:
            self.sight.alive(sum(1 << r for r, v in enumerate(self.echo()) if v))

    def tick(self, now: float) -> bool:
        """Let the sight table measure up to `now` (this node's clock); True if this node's row changed."""
        if self.sight is None:
            return False
        was = self.complete
        changed = self.sight.update(now, self.trust_mask(), was)
        self._fire(was)
        if self.complete and not was:
            changed = self.sight.update(now, self.trust_mask(), True) or changed
        return changed

    def _fire(self, was: bool) -> None:
        if self.complete and not was:
            for f in self.on_complete:
                f()

    def echo(self) -> tuple[int, ...]:
        """The nonce this node shows for each rank: its own, a newer one heard of a trusted peer, a
        trusted one, else the latest heard (here, else relayed)."""
        return tuple(self.nonce if r == self.rank else
                     self.newer.get(r) or self.trusted.get(r) or self.seen.get(r) or self.relayed.get(r, 0)
                     for r in range(self.world))

    def current(self) -> set[int]:
        """The peers whose current incarnation this node trusts: trusted, with no newer nonce heard of them
        and no new incarnation of them still settling (`renewed`, read here)."""
        return {r for r in self.trusted if r not in self.newer and not self.renewed.get(r, (0, 0, False))[2]}

    def trust_mask(self) -> int:
        return sum(1 << r for r in self.current())

    def trusts_me(self, q: int) -> bool:
        """Does peer `q` trust this node's nonce, as far as this node knows: its fresh frames say so, or
        (with a sight table) its row does, unless that row may predate an incarnation it must trust."""
        if q in self.trusted_by:
            return True
        st = self.sight
        return (st is not None and st.trusts(q, self.rank) and q not in self.stale_rows
                and q not in self.renewed)

    @property
    def greeting(self) -> bool:
        """Keep showing status frames: this node is not complete, a new incarnation of a peer is settling,
        or (with a sight table) some rank is not complete yet and may need what this node relays, or a rank
        the room started without runs and is not in yet (it measures the room's screens frame by frame)."""
        if not self.complete or self.renewed or self.newer:
            return True
        return self.sight is not None and (not self.sight.all_complete or self.sight.welcoming)

    @property
    def complete(self) -> bool:
        peers = set(range(self.world)) - {self.rank}
        current = self.current()
        if self.sight is None:
            return peers <= self.trusted_by and peers <= current
        st = self.sight
        if not st.known or not st.member:
            return False
        peers = {p for p in peers if st.members() >> p & 1}  # (the room may have started without some)
        reads = {p for p in peers if st.reads(self.rank, p)}
        readers = {q for q in peers if st.reads(q, self.rank)}
        return reads <= current and all(self.trusts_me(q) for q in readers)


def _newer_version(a: int, b: int) -> bool:
    """Is row version `a` newer than `b` (u16, wrapping; protocols.discovery)?"""
    return a != b and (a - b) & 0xFFFF < 0x8000
