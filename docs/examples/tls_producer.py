"""A producer on a secured broker: TLS and a bearer token (docs/client/guide.md).

The broker's address, the token and the CA that signed the broker's certificate come from
the same variables the CLI reads: HEADRACE_BROKER, HEADRACE_TOKEN and HEADRACE_TLS_CA.
"""

import os

from client import Producer

with Producer(
    os.environ["HEADRACE_BROKER"],
    token=os.environ["HEADRACE_TOKEN"],  # needs produce on the topic
    tls_ca=os.environ["HEADRACE_TLS_CA"],  # setting it turns TLS on
) as producer:
    sent = producer.publish("orders", b"...")
    print("published at", sent.partition, sent.offset)
