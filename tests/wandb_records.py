"""Read back what an offline W&B run recorded, from its run-<id>.wandb file, without W&B's service: the file is a
LevelDB-style log (a 7-byte header ':W&B', 0xBEE1, version; 32 KiB blocks of records, each with a 7-byte header:
crc32, length, type 1 full / 2 first / 3 middle / 4 last) of wandb_internal_pb2.Record protobufs."""

import json
import struct
from pathlib import Path

BLOCK, HEADER = 32768, 7


def records(path: Path):
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert struct.unpack("<4sHB", data[:HEADER])[:2] == (b":W&B", 0xBEE1), path
    position, pieces = HEADER, b""
    while position + HEADER <= len(data):
        left = BLOCK - position % BLOCK
        _, length, kind = struct.unpack("<IHB", data[position : position + HEADER]) if left >= HEADER else (0, 0, 0)
        if kind == 0:  # the zero padding at a block's end
            position += left
            continue
        pieces += data[position + HEADER : position + HEADER + length]
        position += HEADER + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            pieces = b""
            yield record


def run_record(path: Path) -> dict:
    """The run's display name, group, job type and config (every update merged), as W&B would show them."""
    run, config = {}, {}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        updates = record.run.config.update if kind == "run" else record.config.update if kind == "config" else []
        if kind == "run":
            run = {"id": record.run.run_id, "name": record.run.display_name, "group": record.run.run_group}
            run["job_type"] = record.run.job_type
        config.update({item.key: json.loads(item.value_json) for item in updates})
    return run | {"config": config}
