"""What crosses a boundary in WCCL, free of asyncio and I/O.

- `messages`: the typed, frozen messages actors exchange on in-process queues.
- `cells`: the cell colour codec (bytes <-> symbols <-> colours).
- `frames`: the optical frame format (header, payload, checksum) and the
  packetisation of a tensor's bytes into frames and back.
- `layout`: where cells sit on a screen image, and how a frame is drawn.
- `tensors`: torch tensors <-> the bytes that travel.

Nothing here imports any other package of ours.
"""
