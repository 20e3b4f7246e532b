"""What crosses a boundary in WCCL, free of asyncio and I/O.

- `messages`: the typed, frozen messages actors exchange on in-process queues.
- `cells`: the cell colour codec (bytes <-> symbols <-> colours).
- `layout`: where cells sit on a screen image (data, pilots, parity marks,
  sender strips), how a frame and the idle pattern are drawn.
- `fec`: interleaved Reed-Solomon inside one frame.
- `frames`: the frame message (header, fountain packet, check) and the
  RaptorQ fountain code that cuts a tensor into packets and rebuilds it.
- `link`: the whole codec, tensor bytes <-> cell symbols.
- `streams`, `transfer`, `receiver`: a tensor's bytes as frames, sent and rebuilt.
- `discovery`, `sync`, `security`, `algorithms`: start-up, the clocks, the room key and the
  collectives, each as pure state machines.

Nothing here imports any other package of ours, nor torch: the gradient codecs, which turn torch tensors
into the bytes that travel, are `wccl.compression`.
"""
