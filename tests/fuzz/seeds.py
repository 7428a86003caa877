#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz harnesses (tests/fuzz/corpus/<harness>/).

The committed corpus is this script's output; run it again after changing
an input format (python3 tests/fuzz/seeds.py).  Formats are the harnesses'
header comments.  Only the standard library."""
import gzip, hashlib, hmac, json, os, struct

HERE = os.path.dirname(os.path.abspath(__file__))


def put(harness, name, data):
    d = os.path.join(HERE, "corpus", harness)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- json ----------------------------------------------------------------
for i, doc in enumerate([
        b'{"a": [1, 2.5e-3, -0, true, false, null], "b": {"c": "d\\u00e9\\n"}}',
        b'[[[[[]]]]]', b'"\\ud83d\\ude00"', b'18446744073709551615', b'{"k": 1, "k": 2}',
        b'{"x": [1,]}', b'-1.5E+308', b' \t\r\n{} ', b'"\x01"', b'[1e999]']):
    put("json", "doc%d" % i, doc)

# ---- url -----------------------------------------------------------------
for i, u in enumerate([b"file:///tmp/ddp-store", b"file:///a%20b/c?world_size=3",
                       b"tcp://127.0.0.1:29500?rank=0&world_size=2", b"tcp://[::1]:80",
                       b"tcp://host-name.example:65535?rank=1", b"env://", b"env://?world_size=4",
                       b"tcp://h:0", b"file://relative", b"tcp://h:1?rank=2&world_size=2"]):
    put("url", "url%d" % i, u)


# ---- idx -----------------------------------------------------------------
def idx(typ, dims, body):
    return struct.pack(">BBBB", 0, 0, 8, len(dims)) + b"".join(struct.pack(">I", d) for d in dims) + body


labels = idx(8, [3], b"\x01\x02\x03")
images = idx(8, [2, 2, 2], bytes(range(8)))
put("idx", "labels", b"\x00" + labels)
put("idx", "images", b"\x02" + images)
put("idx", "labels.gz", b"\x00" + gzip.compress(labels, mtime=0))
put("idx", "images.gz", b"\x02" + gzip.compress(images, mtime=0))
put("idx", "two-members.gz", b"\x00" + gzip.compress(labels[:6], mtime=0) + gzip.compress(labels[6:], mtime=0))
put("idx", "truncated", b"\x02" + images[:-1])
put("idx", "4d", b"\x03" + idx(8, [1, 1, 2, 2], b"abcd"))


# ---- safetensors -----------------------------------------------------------
def st(tensors, meta=None, pad=0):
    hdr, buf = {}, b""
    for name, shape, data in tensors:
        hdr[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(buf), len(buf) + len(data)]}
        buf += data
    if meta is not None:
        hdr["__metadata__"] = meta
    h = json.dumps(hdr).encode() + b" " * pad
    return struct.pack("<Q", len(h)) + h + buf


f4 = lambda *xs: struct.pack("<%df" % len(xs), *xs)
put("safetensors", "two", st([("w", [2, 2], f4(1, 2, 3, 4)), ("b", [2], f4(5, 6))], {"format": "pt"}, 3))
put("safetensors", "scalar", st([("s", [], f4(1.5))]))
put("safetensors", "empty", st([("e", [0, 3], b"")]))
put("safetensors", "meta-only", st([], {"format": "pt", "step": "12"}))
ov = b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
put("safetensors", "overlap", struct.pack("<Q", len(ov)) + ov + f4(1))

# ---- store_server ----------------------------------------------------------
MAGIC = 0x53504444
SET, GET, ADD, CAS, WAIT, CHECK, DELETE, NUM_KEYS, AUTH = 3, 4, 5, 6, 7, 8, 9, 10, 2


def msg(op, payload):
    return struct.pack("<IBBHIi", MAGIC, 1, op, 0, len(payload), 0) + payload


def b(s):
    return struct.pack("<I", len(s)) + s


def chunks(conn, data):
    """The harness's chunk encoding: byte ((n - 1) << 2) | conn, n bytes."""
    out = b""
    while data:
        n = min(64, len(data))
        out += bytes([((n - 1) << 2) | conn]) + data[:n]
        data = data[n:]
    return out


EXPIRE = b"\x03"
u64 = lambda v: struct.pack("<Q", v)
u32 = lambda v: struct.pack("<I", v)
all_ops = (msg(SET, b(b"k") + b(b"v")) + msg(GET, u64(1000) + b(b"k")) + msg(ADD, u64(5) + b(b"n")) +
           msg(CAS, b(b"k") + b(b"v") + b(b"w")) + msg(WAIT, u64(10) + u32(2) + b(b"k") + b(b"n")) +
           msg(CHECK, u32(1) + b(b"k")) + msg(DELETE, b(b"k")) + msg(NUM_KEYS, b""))
put("store_server", "all-ops", b"\x00" + chunks(0, all_ops))
put("store_server", "park-notify", b"\x00" + chunks(1, msg(GET, u64(60000) + b(b"late"))) +
    chunks(2, msg(WAIT, u64(60000) + u32(2) + b(b"late") + b(b"x"))) + chunks(0, msg(SET, b(b"late") + b(b"1"))) +
    chunks(0, msg(ADD, u64(1) + b(b"x"))) + chunks(1, msg(NUM_KEYS, b"")))
put("store_server", "timeout", b"\x00" + chunks(1, msg(GET, u64(0) + b(b"never"))) + EXPIRE + chunks(1, msg(CHECK, u32(1) + b(b"never"))))
secret, nonce_s, nonce_c = b"fuzz-secret", bytes(32), bytes(range(32))
mac = hmac.new(secret, b"ddp-store-v1 client\x00" + nonce_s + nonce_c, hashlib.sha256).digest()
put("store_server", "auth", b"\x01" + chunks(1, msg(AUTH, nonce_c + mac) + msg(SET, b(b"a") + b(b"b"))) +
    chunks(0, msg(AUTH, nonce_c + bytes(32))))
put("store_server", "authed-0", b"\x03" + chunks(0, msg(SET, b(b"a") + b(b"b"))) + chunks(2, msg(GET, u64(5) + b(b"a"))))
put("store_server", "bad-header", b"\x00" + chunks(0, struct.pack("<IBBHIi", MAGIC, 1, SET, 0, 0xFFFFFFFF, 0)))

# ---- handshake -------------------------------------------------------------
HS_MAGIC, GROUP = 0x48504444, bytes([0x47]) * 32


def hs_head(typ, word):
    return struct.pack("<IHBBI", HS_MAGIC, 1, typ, 0, word)


def hello(size, src, dst, group=GROUP, secret_flag=0):
    return hs_head(1, secret_flag) + struct.pack("<IIII", size, src, dst, 0) + group + bytes(range(32))


def hs_mac(key, label, hello_bytes):
    return hmac.new(key, label.ljust(8, b"\x00")[:8] + hello_bytes + bytes(32), hashlib.sha256).digest()


for flags, key in ((0, b""), (1, b"fuzz-secret")):
    h = hello(4, 1, 2, secret_flag=flags)
    put("handshake", "ok-%d" % flags, bytes([flags]) + h + hs_head(3, 0) + hs_mac(key, b"ddp-cli", h))
    put("handshake", "bad-auth-%d" % flags, bytes([flags]) + h + hs_head(3, 0) + bytes(32))
put("handshake", "duplicate", b"\x02" + hello(4, 0, 2))
put("handshake", "bad-rank", b"\x00" + hello(4, 3, 2))
put("handshake", "bad-group", b"\x00" + hello(4, 0, 2, group=bytes(32)))
put("handshake", "bad-version", b"\x00" + struct.pack("<IHBBI", HS_MAGIC, 2, 1, 0, 0) + bytes(80))


# ---- tcp_frames ------------------------------------------------------------
def frame(op, tag, payload, length=None):
    w = 0x46504444 | 1 << 32 | op << 40
    return struct.pack("<QQQ", w, tag, len(payload) if length is None else length) + payload


def recvs(*specs):
    return bytes([len(specs)]) + b"".join(struct.pack("<BH", t, n) for t, n in specs)


put("tcp_frames", "data", recvs((5, 10)) + frame(1, 5, b"0123456789"))
put("tcp_frames", "two-tags", recvs((1, 4), (2, 3)) + frame(1, 2, b"abc") + frame(1, 1, b"wxyz"))
put("tcp_frames", "large", recvs((7, 6000)) + frame(1, 7, bytes(6000)))
put("tcp_frames", "unexpected", recvs((9, 2)) + frame(1, 8, b"zz") + frame(1, 9, b"yy"))
put("tcp_frames", "bye", recvs((1, 1)) + frame(2, 0, b""))
put("tcp_frames", "abort", recvs((1, 1)) + frame(3, 0, b"rank 1 gave up: out of memory"))
put("tcp_frames", "length-mismatch", recvs((3, 8)) + frame(1, 3, b"1234"))
put("tcp_frames", "huge-length", recvs((3, 8)) + frame(1, 3, b"", length=1 << 39))
put("tcp_frames", "short", recvs((4, 100)) + frame(1, 4, b"x" * 50, length=100))
