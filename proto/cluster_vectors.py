"""Conformance vectors of the cluster's routing: ``docs/protocol/vectors/cluster/``.

Role: owns the refusals and the Lookup answer a client in any language tests its
redirect handling against, and writes them as JSON; :func:`proto.vectors.write` calls
:func:`write`, so ``python -m proto.vectors`` and its ``--check`` cover these files too.
``tests/broker/test_cluster_vectors.py`` checks that the broker's refusal (its status,
trailers and ``PublishStream`` response, over real gRPC) and its Lookup converter produce
exactly what the files say.

Files:

- ``refusal_<case>.json``: ``{description, refusal: {reason, topic, owner_node,
  owner_address, owner_epoch, message}, status, status_code, trailers: [[key, value],
  ...], publish_stream_response: {error_code, error_message, redirect: {...}}, client:
  {action, retry_at, same_sequence}}``: a broker that refuses a call with ``refusal``
  ends a unary call or a Subscribe with ``status`` and exactly these trailers (in this
  order) and ``message`` as the status details, and answers a ``PublishStream`` request
  with ``publish_stream_response``; a client then does ``client.action``
  (:class:`proto.refusal.Action`): ``redirect`` resends at once to ``retry_at``,
  ``backoff`` waits, looks the topic up again and resends where the new route says;
  either way with the same producer id and sequence (``same_sequence``).
- ``lookup.json``: ``{description, request, response, picks: [{topic, action, address}]}``:
  a ``LookupResponse`` in proto3 JSON (int64 as strings, every field printed) and, per
  route, what a client does with it (:class:`proto.refusal.RouteAction`).

Pure module apart from :func:`write`: imports nothing of ours but :mod:`proto`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from proto import cluster_pb2 as _cluster
from proto.refusal import (
    ABORTED,
    Redirection,
    action,
    redirect_fields,
    route_action,
    trailers,
)

CLUSTER = "cluster"


@dataclass(frozen=True)
class RefusalCase:
    """One refusal a broker may answer, with its message for a person."""

    name: str
    description: str
    redirection: Redirection
    message: str


REFUSALS: tuple[RefusalCase, ...] = (
    RefusalCase(
        "not_owner",
        "Another broker owns the topic and its address is known: resend there at once.",
        Redirection("not-owner", "orders", "b2", "10.0.0.2:50051", 3),
        "topic 'orders' is owned by broker b2 at 10.0.0.2:50051 (epoch 3); send the call "
        "there (look the topic up again if that fails)",
    ),
    RefusalCase(
        "not_owner_unknown",
        "The topic has no owner yet as far as this broker knows (it is being placed): "
        "back off and look it up again.",
        Redirection("not-owner", "orders"),
        "topic 'orders' has no owner yet; look it up again in a moment",
    ),
    RefusalCase(
        "offline",
        "The owner is known but not alive (one copy: its topics wait for it): back off "
        "and look it up again; the owner's address is given for the person, not to call.",
        Redirection("offline", "orders", "b2", "10.0.0.2:50051", 3),
        "topic 'orders' is offline: its owner, broker b2 at 10.0.0.2:50051, has no live "
        "session; it comes back when b2 does",
    ),
    RefusalCase(
        "no_session",
        "This broker owns the topic but may no longer write (its etcd session may have "
        "expired); reads go on. Back off and look it up again.",
        Redirection("no-session", "orders", "b1", "10.0.0.1:50051", 3),
        "broker b1 owns topic 'orders' but cannot reach etcd to renew its session, so it "
        "accepts no writes; retry in a moment",
    ),
    RefusalCase(
        "data_missing",
        "This broker owns the topic but its files are gone (an empty data disk): the "
        "topic is offline until an operator acts. Back off and look it up again.",
        Redirection("data-missing", "orders", "b1", "10.0.0.1:50051", 3),
        "topic 'orders' is offline: its data is missing on broker b1 (an empty data "
        "directory?); an operator must restore it",
    ),
    RefusalCase(
        "creating",
        "The topic is being created on its owner and is not ready yet: back off and "
        "look it up again.",
        Redirection("creating", "orders", "b2", "10.0.0.2:50051", 0),
        "topic 'orders' is being created on broker b2; retry in a moment",
    ),
    RefusalCase(
        "not_enough_replicas",
        "This broker leads the replicated topic but fewer of its replicas are in sync than "
        "its min_insync: no publish is appended (reads go on). Back off and look it up "
        "again; resend the same batch.",
        Redirection("not-enough-replicas", "orders", "b1", "10.0.0.1:50051", 3),
        "topic orders has 1 in-sync replica of 3; at least 2 are needed "
        "(min_insync_replicas): nothing was written; retry when a replica has caught up, "
        "or bring its broker back",
    ),
)


def refusal_document(case: RefusalCase) -> dict[str, object]:
    """The JSON document of one refusal vector."""
    r = case.redirection
    todo = action(r)
    return {
        "description": case.description,
        "refusal": {**redirect_fields(r), "message": case.message},
        "status": "ABORTED",
        "status_code": ABORTED,
        "trailers": [list(pair) for pair in trailers(r)],
        "publish_stream_response": {
            "error_code": ABORTED,
            "error_message": case.message,
            "redirect": redirect_fields(r),
        },
        "client": {
            "action": todo.value,
            "retry_at": r.owner_address if todo.value == "redirect" else "",
            "same_sequence": True,
        },
    }


def lookup_example() -> tuple[_cluster.LookupRequest, _cluster.LookupResponse]:
    """A Lookup of four topics on a two-broker cluster whose b3 is down; ``orders`` has
    two replicas, the one on b3 out of the in-sync set."""
    request = _cluster.LookupRequest(topics=["orders", "audit", "fresh", "nothing"])
    response = _cluster.LookupResponse(
        routes=[
            _cluster.TopicRoute(
                topic="orders", owner_node="b2", owner_address="10.0.0.2:50051", epoch=3,
                state="ready", online=True, partitions=3, replicas=["b2", "b3"],
                isr=["b2"], min_insync=1,
            ),
            _cluster.TopicRoute(
                topic="audit", owner_node="b3", owner_address="10.0.0.3:50051", epoch=1,
                state="ready", online=False, partitions=1, reason="offline",
                replicas=["b3"], isr=["b3"], min_insync=1,
            ),
            _cluster.TopicRoute(
                topic="fresh", owner_node="b2", owner_address="10.0.0.2:50051", epoch=0,
                state="creating", online=False, partitions=2, reason="creating",
                replicas=["b2"], isr=["b2"], min_insync=1,
            ),
            _cluster.TopicRoute(topic="nothing", state="absent"),
        ],
        brokers=[
            _cluster.BrokerInfo(
                node_id="b2", address="10.0.0.2:50051", alive=True, topics=2, partitions=5,
                session_age_s=3600.5,
            ),
            _cluster.BrokerInfo(
                node_id="b3", address="10.0.0.3:50051", alive=False, topics=1, partitions=1,
            ),
        ],
        controller="b2",
        revision=1234,
        node_id="b2",
    )  # fmt: skip
    return request, response


def lookup_document() -> dict[str, object]:
    """The JSON document of the Lookup vector."""
    request, response = lookup_example()
    picks = []
    for route in response.routes:
        todo = route_action(
            state=route.state, online=route.online, owner_address=route.owner_address
        )
        address = route.owner_address if todo.value == "call" else ""
        picks.append({"topic": route.topic, "action": todo.value, "address": address})
    return {
        "description": (
            "A Lookup answer (proto3 JSON) and what a client does with each route: call "
            "owner_address only when the route is online (or, when owner_node is the "
            "answering node_id, MAY use the connection it asked on); an absent topic is "
            "not found; any other route waits (backoff, then look up again)."
        ),
        "request": _json(request),
        "response": _json(response),
        "picks": picks,
    }


def _json(message: Message) -> dict[str, object]:
    """``message`` in proto3 JSON (proto field names, int64 as strings, every field
    printed), its fields in declaration order."""
    out: dict[str, object] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None:
            out[field.name] = [_json(v) for v in value] if _repeated(field) else _json(value)
        elif field.type in _INT64:
            out[field.name] = [str(v) for v in value] if _repeated(field) else str(value)
        else:
            out[field.name] = list(value) if _repeated(field) else value
    return out


_INT64 = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64}


def _repeated(field: Any) -> bool:
    """Whether a field (either protobuf runtime's descriptor type) is repeated."""
    return bool(field.is_repeated)


def write(out: Path) -> list[Path]:
    """Write the cluster vectors under ``out`` (the vectors directory); return the files."""
    folder = out / CLUSTER
    folder.mkdir(parents=True, exist_ok=True)
    docs = {f"refusal_{c.name}.json": refusal_document(c) for c in REFUSALS}
    docs["lookup.json"] = lookup_document()
    written = []
    for name, doc in docs.items():
        path = folder / name
        path.write_text(json.dumps(doc, indent=1, ensure_ascii=True) + "\n", encoding="utf-8")
        written.append(path)
    return written
