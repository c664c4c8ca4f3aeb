"""The Python client's first program: create a topic, publish, consume (docs/client/guide.md)."""

import asyncio

from client import AsyncAdminClient, AsyncConsumer, AsyncProducer

BROKER = "127.0.0.1:50051"


async def main() -> None:
    async with AsyncAdminClient(BROKER) as admin:
        await admin.create_topic("events", partitions=3, exist_ok=True)  # so it runs twice
    async with AsyncProducer(BROKER, linger_ms=5) as producer:
        hello = await producer.publish("events", b"hello", key=b"user-1")
        print("hello is at", hello.partition, hello.offset)  # durable: fsynced before the ack
        futures = [await producer.send("events", b"x" * 100) for _ in range(1_000)]
        await asyncio.gather(*futures)  # batched, pipelined, idempotent
        sent = await (await producer.send_many("events", [b"y" * 100] * 10_000))
        print("sent", len(sent), "more in bulk")  # columnar bulk path: no Python work per record
    async with AsyncConsumer("events", "audit", broker=BROKER) as consumer:
        deliveries = 0
        async for message in consumer:  # reconnects by itself after a broker restart
            consumer.ack(message)  # batched behind the scenes; ack_cumulative too
            deliveries += 1
            if (message.partition, message.offset) == (hello.partition, hello.offset):
                break
        print("audit got this run's hello at delivery", deliveries)


asyncio.run(main())
