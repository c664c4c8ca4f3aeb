// A Headrace client in Node, written from docs/protocol.md and proto/*.proto alone.
//
// It creates a topic, publishes records (binary batches encoded here, or with --simple the
// simple path, PublishRequest.records), reads them back through Fetch (binary batches
// decoded here, CRC-32C checked), then through a Subscribe stream (credit, acks, drain,
// drained, half-close), and prints one JSON document on stdout:
//   {"published": [R...], "fetched": [R...], "consumed": [R...],
//    "fetch_at_5": {"first_batch_base_offset": n, "first_offset_returned": n},
//    "subscribed": {...}, "vectors": {"checked": n}}
// where R = {"offset", "timestamp_ms", "key": base64|null, "value": base64,
//            "headers": [[name, base64], ...]}.
// Usage: node client.mjs --target 127.0.0.1:PORT --proto DIR --topic NAME --count N
//        [--simple] [--vectors DIR]
// Exit status 0 on success; on a failure one line on stderr and exit 1.

import fs from "node:fs";
import path from "node:path";
import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";

// ---------------------------------------------------------------------------------------
// Arguments

function parseArgs(argv) {
  const args = { simple: false, count: 1000, vectors: null };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--simple") args.simple = true;
    else if (["--target", "--proto", "--topic", "--count", "--vectors"].includes(a)) {
      args[a.slice(2)] = argv[++i];
    } else throw new Error(`unknown argument ${a}`);
  }
  for (const need of ["target", "proto", "topic"]) {
    if (!args[need]) throw new Error(`--${need} is required`);
  }
  args.count = Number(args.count);
  return args;
}

// ---------------------------------------------------------------------------------------
// CRC-32C (Castagnoli, reflected 0x82F63B78), docs/protocol.md 2.2

const CRC_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
    t[n] = c >>> 0;
  }
  return t;
})();

export function crc32c(buf) {
  let c = 0xffffffff;
  for (let i = 0; i < buf.length; i++) c = CRC_TABLE[(c ^ buf[i]) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

// ---------------------------------------------------------------------------------------
// The record batch, docs/protocol.md section 2

const HEADER_SIZE = 56;
const MAGIC = 0x48;
const VERSION = 1;
const FLAG_HEADERS = 1;
const pad8 = (n) => (n + 7) & ~7;

// records: [{key: Buffer|null, value: Buffer, headers: [[name, Buffer]], timestamp_ms}]
// hasHeaders: set the headers flag; by default exactly when a record has a header.
export function encodeBatch(records, producerId = -1n, baseSequence = -1, hasHeaders = null) {
  const n = records.length;
  if (n === 0) throw new Error("a batch holds at least one record");
  hasHeaders ??= records.some((r) => r.headers.length > 0);
  const keys = records.map((r) => r.key ?? Buffer.alloc(0));
  const values = records.map((r) => r.value);
  const names = [];
  const hvalues = [];
  for (const r of records) {
    for (const [name, v] of r.headers) {
      names.push(Buffer.from(name, "utf8"));
      hvalues.push(v);
    }
  }
  const offsets = (items) => {
    const a = new Int32Array(items.length + 1);
    for (let i = 0; i < items.length; i++) a[i + 1] = a[i] + items[i].length;
    return a;
  };
  const sections = [];
  const ts = new BigInt64Array(records.map((r) => BigInt(r.timestamp_ms)));
  sections.push(Buffer.from(ts.buffer));
  const bitmap = Buffer.alloc((n + 7) >> 3);
  records.forEach((r, i) => {
    if (r.key !== null) bitmap[i >> 3] |= 1 << (i & 7);
  });
  sections.push(bitmap);
  const binary = (items) => {
    sections.push(Buffer.from(offsets(items).buffer));
    sections.push(Buffer.concat(items));
  };
  binary(keys);
  binary(values);
  if (hasHeaders) {
    const per = new Int32Array(n + 1);
    records.forEach((r, i) => (per[i + 1] = per[i] + r.headers.length));
    sections.push(Buffer.from(per.buffer));
    binary(names);
    binary(hvalues);
  }
  const length = HEADER_SIZE + sections.reduce((s, b) => s + pad8(b.length), 0);
  const out = Buffer.alloc(length); // zero-filled: padding and reserved are 0
  let p = HEADER_SIZE;
  for (const s of sections) {
    s.copy(out, p);
    p += pad8(s.length);
  }
  let max = ts[0];
  for (const t of ts) if (t > max) max = t;
  out.writeBigUInt64LE(0n, 0); // base_offset: a producer sends 0
  out.writeUInt32LE(length, 8);
  out.writeUInt8(MAGIC, 16);
  out.writeUInt8(VERSION, 17);
  out.writeUInt16LE(hasHeaders ? FLAG_HEADERS : 0, 18);
  out.writeUInt32LE(n, 20);
  out.writeBigInt64LE(ts[0], 24); // the first record's timestamp, not the minimum
  out.writeBigInt64LE(max, 32);
  out.writeBigInt64LE(BigInt(producerId), 40);
  out.writeInt32LE(baseSequence, 48);
  out.writeUInt32LE(0, 52);
  out.writeUInt32LE(crc32c(out.subarray(16)), 12);
  return out;
}

class BatchError extends Error {}

// Decode one whole batch; every position is checked against the batch length. With
// `strict`, also every rule a writer must obey (protocol 2.4): what a broker checks on
// publish, so a published batch has base_offset 0.
export function decodeBatch(buf, strict = false) {
  if (buf.length < HEADER_SIZE) throw new BatchError(`batch of ${buf.length} bytes`);
  const length = buf.readUInt32LE(8);
  if (length !== buf.length || length % 8 !== 0) {
    throw new BatchError(`batch_length ${length}, got ${buf.length} bytes`);
  }
  if (buf[16] !== MAGIC || buf[17] !== VERSION) throw new BatchError("bad magic/version");
  const crc = buf.readUInt32LE(12);
  if (crc32c(buf.subarray(16)) !== crc) throw new BatchError("checksum mismatch");
  const flags = buf.readUInt16LE(18);
  const n = buf.readUInt32LE(20);
  if (n < 1 || flags & ~FLAG_HEADERS) throw new BatchError(`record_count ${n} flags ${flags}`);
  const baseOffset = buf.readBigUInt64LE(0);
  if (strict) {
    if (baseOffset !== 0n) throw new BatchError("base_offset must be 0");
    if (buf.readUInt32LE(52) !== 0) throw new BatchError("reserved must be 0");
    const producerId = buf.readBigInt64LE(40);
    if (producerId < -1n) throw new BatchError("producer_id must be -1 or >= 0");
    if (producerId === -1n && buf.readInt32LE(48) !== -1) {
      throw new BatchError("base_sequence must be -1 when producer_id is -1");
    }
  }
  let p = HEADER_SIZE;
  const padding = (end) => {
    for (let i = end; strict && i < pad8(end); i++) {
      if (buf[i] !== 0) throw new BatchError("padding must be 0");
    }
  };
  const need = (end, what) => {
    if (end > length) throw new BatchError(`${what} runs past the end of the batch`);
  };
  const i32s = (count, what) => {
    need(p + 4 * count, what);
    const a = [];
    for (let i = 0; i < count; i++) a.push(buf.readInt32LE(p + 4 * i));
    if (a[0] !== 0 || a.some((v, i) => i > 0 && v < a[i - 1])) {
      throw new BatchError(`${what} must start at 0 and never decrease`);
    }
    padding(p + 4 * count);
    p += pad8(4 * count);
    return a;
  };
  const data = (len, what) => {
    need(p + len, what);
    const d = buf.subarray(p, p + len);
    padding(p + len);
    p += pad8(len);
    return d;
  };
  need(p + 8 * n, "timestamps");
  const ts = [];
  for (let i = 0; i < n; i++) ts.push(buf.readBigInt64LE(p + 8 * i));
  p += 8 * n;
  const bitmap = data((n + 7) >> 3, "key_validity");
  const ko = i32s(n + 1, "key_offsets");
  const kd = data(ko[n], "key_data");
  const vo = i32s(n + 1, "value_offsets");
  const vd = data(vo[n], "value_data");
  let per = new Array(n + 1).fill(0);
  let names = [];
  let hvals = [];
  if (flags & FLAG_HEADERS) {
    per = i32s(n + 1, "header_offsets");
    const m = per[n];
    const hko = i32s(m + 1, "header_key_offsets");
    const hkd = data(hko[m], "header_key_data");
    const hvo = i32s(m + 1, "header_value_offsets");
    const hvd = data(hvo[m], "header_value_data");
    const utf8 = new TextDecoder("utf-8", { fatal: true });
    names = hko.slice(0, m).map((a, j) => utf8.decode(hkd.subarray(a, hko[j + 1])));
    hvals = hvo.slice(0, m).map((a, j) => hvd.subarray(a, hvo[j + 1]));
  }
  if (p !== length) throw new BatchError(`sections end at ${p}, batch length is ${length}`);
  if (ts[0] !== buf.readBigInt64LE(24)) throw new BatchError("first_timestamp_ms");
  if (strict) {
    if (ts.reduce((a, b) => (b > a ? b : a)) !== buf.readBigInt64LE(32)) {
      throw new BatchError("max_timestamp_ms is not the maximum");
    }
    if (n % 8 && bitmap[bitmap.length - 1] >> n % 8) {
      throw new BatchError("key validity bits past the last record");
    }
  }
  const records = [];
  for (let i = 0; i < n; i++) {
    const hasKey = (bitmap[i >> 3] >> (i & 7)) & 1;
    const headers = [];
    for (let j = per[i]; j < per[i + 1]; j++) headers.push([names[j], hvals[j]]);
    records.push({
      offset: Number(baseOffset) + i,
      timestamp_ms: Number(ts[i]),
      key: hasKey ? kd.subarray(ko[i], ko[i + 1]) : null,
      value: vd.subarray(vo[i], vo[i + 1]),
      headers,
    });
  }
  return { baseOffset: Number(baseOffset), count: n, producerId: buf.readBigInt64LE(40), records };
}

// ---------------------------------------------------------------------------------------
// Records as JSON (base64), the shape of docs/protocol/vectors/*.json

const b64 = (b) => Buffer.from(b).toString("base64");
const asJson = (r) => ({
  offset: r.offset,
  timestamp_ms: r.timestamp_ms,
  key: r.key === null ? null : b64(r.key),
  value: b64(r.value),
  headers: r.headers.map(([name, v]) => [name, b64(v)]),
});

// Check this decoder and encoder against the conformance vectors: each valid one decodes
// to its JSON and re-encodes byte-identically; each invalid one is refused (strict mode).
function checkVectors(dir) {
  const read = (...parts) => fs.readFileSync(path.join(dir, ...parts));
  const bins = (sub) => fs.readdirSync(path.join(dir, sub)).filter((f) => f.endsWith(".bin")).sort();
  let checked = 0;
  for (const file of bins(".")) {
    const bin = read(file);
    const want = JSON.parse(read(file.replace(/\.bin$/, ".json")));
    const got = decodeBatch(bin, true).records.map(asJson);
    if (JSON.stringify(got) !== JSON.stringify(want.records)) {
      throw new Error(`vector ${file}: decoded records differ from its JSON`);
    }
    const again = encodeBatch(
      got.map((r) => ({
        key: r.key === null ? null : Buffer.from(r.key, "base64"),
        value: Buffer.from(r.value, "base64"),
        headers: r.headers.map(([k, v]) => [k, Buffer.from(v, "base64")]),
        timestamp_ms: r.timestamp_ms,
      })),
      BigInt(want.producer_id),
      want.base_sequence,
      want.has_headers,
    );
    if (!again.equals(bin)) throw new Error(`vector ${file}: re-encoding is not byte-identical`);
    checked++;
  }
  for (const file of bins("invalid")) {
    try {
      decodeBatch(read("invalid", file), true);
    } catch (e) {
      if (!(e instanceof BatchError || e instanceof RangeError || e instanceof TypeError)) throw e;
      checked++;
      continue;
    }
    throw new Error(`invalid vector ${file} was decoded without an error`);
  }
  return checked;
}

// ---------------------------------------------------------------------------------------
// The workload: deterministic records

// The simple path refuses a header name twice in one record (protocol 4), so with
// `simple` no record repeats one; binary batches carry duplicates, which readers keep.
function makeRecords(count, simple) {
  const out = [];
  for (let i = 0; i < count; i++) {
    const headers = [];
    if (i % 3 === 0) headers.push(["i", Buffer.from(String(i))]);
    if (i % 50 === 7 && !simple) headers.push(["dup", Buffer.from("a")], ["dup", Buffer.from("b")]);
    if (i % 97 === 1) headers.push(["\u00fcber-\u2713", Buffer.alloc(0)]);
    out.push({
      key: i % 5 === 0 ? null : i % 11 === 0 ? Buffer.alloc(0) : Buffer.from(`key-${i % 13}`),
      value: Buffer.from(`value-${i}-`.repeat(1 + (i % 4))),
      headers,
      timestamp_ms: 1700000000000 + ((i * 7) % 1000),
    });
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// gRPC

function loadServices(protoDir) {
  const def = protoLoader.loadSync(
    [path.join(protoDir, "broker.proto"), path.join(protoDir, "admin.proto")],
    { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true, includeDirs: [protoDir] },
  );
  const pkg = grpc.loadPackageDefinition(def).headrace.v1;
  return pkg;
}

const unary = (client, method, request) =>
  new Promise((resolve, reject) => {
    client[method](request, new grpc.Metadata(), { deadline: Date.now() + 20000 }, (err, res) =>
      err ? reject(new Error(`${method}: ${err.code} ${err.details}`)) : resolve(res),
    );
  });

async function publish(broker, topic, records, simple) {
  const BATCH = 100;
  for (let start = 0; start < records.length; start += BATCH) {
    const chunk = records.slice(start, start + BATCH);
    const request = { topic, partition: 0, request_id: String(start) };
    if (simple) {
      request.records = chunk.map((r) => ({
        ...(r.key === null ? {} : { key: r.key }),
        value: r.value,
        headers: r.headers.map(([name, value]) => ({ name, value })),
        timestamp_ms: String(r.timestamp_ms),
      }));
    } else {
      request.batch = encodeBatch(chunk);
    }
    const res = await unary(broker, "Publish", request);
    if (Number(res.base_offset) !== start || Number(res.last_offset) !== start + chunk.length - 1) {
      throw new Error(`Publish of ${start}: offsets ${res.base_offset}-${res.last_offset}`);
    }
    if (res.request_id !== String(start)) throw new Error(`request_id ${res.request_id} not echoed`);
  }
}

async function fetchAll(broker, topic, from, until) {
  const out = [];
  let offset = from;
  let firstBatchBase = null;
  while (offset < until) {
    const res = await unary(broker, "Fetch", { topic, partition: 0, offset: String(offset), max_bytes: 0 });
    if (res.batches.length === 0) throw new Error(`Fetch at ${offset}: no batches below ${until}`);
    for (const raw of res.batches) {
      const batch = decodeBatch(raw);
      if (firstBatchBase === null) firstBatchBase = batch.baseOffset;
      // A Fetch returns whole batches: the first may start before `offset` (protocol 5).
      for (const r of batch.records) if (r.offset >= offset) out.push(r);
      offset = batch.baseOffset + batch.count;
    }
  }
  return { records: out, firstBatchBase };
}

function consume(broker, topic, count) {
  return new Promise((resolve, reject) => {
    const call = broker.Subscribe();
    const got = new Map();
    let subscribed = null;
    let draining = false;
    call.on("data", (msg) => {
      try {
        if (msg.kind === "subscribed") {
          subscribed = msg.subscribed;
          return;
        }
        if (msg.kind === "drained") {
          call.end(); // everything delivered was acked: nothing to release
          return;
        }
        const d = msg.delivery;
        const from = Number(d.from_offset);
        const to = Number(d.to_offset);
        const batch = decodeBatch(d.batch);
        // Hand over only [from_offset, to_offset) of the batch (protocol 6.3).
        for (const r of batch.records) if (r.offset >= from && r.offset < to) got.set(r.offset, r);
        call.write({ ack: { ranges: [{ partition: d.partition, begin: String(from), end: String(to) }] } });
        call.write({ credit: to - from });
        if (got.size >= count && !draining) {
          draining = true;
          call.write({ drain: {} });
        }
      } catch (e) {
        call.cancel();
        reject(e);
      }
    });
    call.on("error", (e) => reject(new Error(`Subscribe: ${e.code} ${e.details}`)));
    call.on("end", () =>
      resolve({ subscribed, records: [...got.keys()].sort((a, b) => a - b).map((o) => got.get(o)) }),
    );
    call.write({
      open: { topic, subscription: "node-interop", type: "EXCLUSIVE", initial_credit: 200, consumer_name: "node" },
    });
  });
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const pkg = loadServices(args.proto);
  const options = { "grpc.max_receive_message_length": -1 };
  const creds = grpc.credentials.createInsecure();
  const admin = new pkg.Admin(args.target, creds, options);
  const broker = new pkg.Broker(args.target, creds, options);
  const vectors = args.vectors ? checkVectors(args.vectors) : 0;
  await unary(admin, "CreateTopic", { name: args.topic, partitions: 1 });
  const records = makeRecords(args.count, args.simple);
  await publish(broker, args.topic, records, args.simple);
  const published = records.map((r, i) => asJson({ ...r, offset: i }));
  const fetched = await fetchAll(broker, args.topic, 0, args.count);
  const at5 = await fetchAll(broker, args.topic, 5, 6);
  const consumed = await consume(broker, args.topic, args.count);
  admin.close();
  broker.close();
  process.stdout.write(
    JSON.stringify({
      published,
      fetched: fetched.records.map(asJson),
      fetch_at_5: { first_batch_base_offset: at5.firstBatchBase, first_offset_returned: at5.records[0].offset },
      consumed: consumed.records.map(asJson),
      subscribed: consumed.subscribed,
      vectors: { checked: vectors },
    }) + "\n",
  );
}

main().catch((e) => {
  process.stderr.write(`node interop client: ${e.message}\n`);
  process.exit(1);
});
