"""The ring file's layout, version 1 (shm/FORMAT.md is the specification; shm/layout.go holds the same numbers).

Wire format: never change without bumping VERSION."""

from __future__ import annotations

import struct
from typing import Final

MAGIC: Final = b"KVSHMRG\x00"
VERSION: Final = 1
# The header is 4096 bytes whatever the CPU's page size (64 KiB on many aarch64 kernels): the file is mapped whole
# from offset 0, so nothing needs the data area to start on a page boundary.
HEADER_SIZE: Final = 4096
OFF_STATE: Final = 0x048  # u32
OFF_TAIL: Final = 0x080  # u64, producer: the commit word; its low 32 bits are the doorbell's futex
OFF_HEAD: Final = 0x100  # u64, consumer
OFF_DROPPED_EVENTS: Final = 0x180
OFF_DROPPED_BYTES: Final = 0x188
OFF_LOSS_FIRST: Final = 0x190
OFF_LOSS_LAST: Final = 0x198
OFF_LOSS_PENDING: Final = 0x1A0
OFF_HEARTBEAT: Final = 0x200
OFF_PARKED: Final = 0x208  # u32, consumer: the doorbell flag (the u64 at 0x208 is the flag plus 4 zero bytes)
STATE_INIT: Final = 0
STATE_READY: Final = 1
STATE_CLOSED: Final = 2
TYPE_EVENT: Final = 1
TYPE_LOSS: Final = 2
TYPE_PADDING: Final = 0xFFFFFFFF
RECORD_HEADER: Final = 8
LOSS_RECORD: Final = RECORD_HEADER + 24
MIN_CAPACITY: Final = 64 << 10
MAX_CAPACITY: Final = 4 << 30
# Static header fields 0x000..0x048: magic, version, header_size, capacity, max_record, flags, pid, reserved,
# producer_start_time, epoch, worker_id, kv_block_size, max_buffer_size.
HEADER: Final = struct.Struct("<8sIIQIIIIQQQII")
# The producer's identity: magic .. producer_pid (0x20) .. producer_start_time (0x28).
IDENTITY: Final = struct.Struct("<8s24xIIQ")
