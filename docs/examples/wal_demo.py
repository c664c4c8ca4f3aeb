"""The write-ahead log on its own: append a record, read it back (docs/operations/wal.md)."""

import asyncio

from wal import LogConfig, LogWriter, Record, encode_records


async def main() -> None:
    async with await LogWriter.open("./wal-demo", LogConfig()) as log:
        result = await log.append(encode_records([Record(b"hello", key=b"k1")]))
        print(result.first_offset, result.last_offset)  # durable: fsynced before this returns
        for batch in log.read(0):
            print(batch.base_offset, batch.values())


asyncio.run(main())
