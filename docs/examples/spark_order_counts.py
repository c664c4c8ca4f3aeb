"""Count orders per customer with Spark, from topic "orders" into topic "order-counts".

Needs the broker of `make run` (127.0.0.1:50051) and Java 17. It creates both topics when
they are missing, publishes 300 orders (100 for each of three customers), runs a streaming
query until it has read every order there is (trigger availableNow) and prints each
customer's count as the query published it. Its checkpoint, ./order-counts-checkpoint,
keeps the query's position and counts: run it again and each count grows by 100.
"""

from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812 - Spark's convention

import spark_connector  # before the session: Spark's Python workers then run this Python
from client import AdminClient, Producer

BROKER = "127.0.0.1:50051"
CUSTOMERS = [b"alice", b"bob", b"carol"]

with AdminClient(BROKER) as admin:
    admin.create_topic("orders", partitions=3, exist_ok=True)
    admin.create_topic("order-counts", partitions=1, exist_ok=True)
with Producer(BROKER) as producer:
    keys = [CUSTOMERS[n % 3] for n in range(300)]
    producer.send_many("orders", [b"order %d" % n for n in range(300)], keys=keys).result()

spark = (
    SparkSession.builder.appName("order-counts")
    .config("spark.sql.shuffle.partitions", "2")  # a small job: 2 tasks per batch, not 200
    .config("spark.ui.showConsoleProgress", "false")
    .getOrCreate()
)
spark.sparkContext.setLogLevel("ERROR")
spark_connector.register(spark)  # only needed where Spark did not find the source itself

orders = (
    spark.readStream.format("headrace")
    .option("broker", BROKER)
    .option("topic", "orders")
    .option("subscription", "spark-order-counts")  # its cursor follows Spark's commits
    .load()
)  # columns: topic, partition, offset, key, value, timestamp, headers
counts = orders.where(F.col("key").isNotNull()).groupBy("key").agg(F.count("*").alias("n"))
query = (
    counts.select("key", F.col("n").cast("string").cast("binary").alias("value"))
    .writeStream.format("headrace")  # publish to a topic, exactly once
    .outputMode("complete")  # every batch publishes the whole table of counts
    .option("broker", BROKER)
    .option("topic", "order-counts")
    .option("checkpointLocation", "order-counts-checkpoint")
    .trigger(availableNow=True)  # read what is there now, then stop
    .start()
)
query.awaitTermination()  # returns when the query has read everything; raises if it failed

# The latest record of each key in "order-counts" is that customer's count.
published = spark.read.format("headrace").option("broker", BROKER).option("topic", "order-counts")
latest = published.load().groupBy("key").agg(F.max_by("value", "offset").alias("n"))
for row in latest.orderBy("key").collect():
    print(row.key.decode(), int(row.n))
spark.stop()
