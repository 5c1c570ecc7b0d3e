#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into corpus/<target>/ (committed; run again only to
change them). Seeds are small valid inputs plus a few known-bad ones, so the fuzzer starts from
every branch of the readers. See fuzz_idx.cpp for the IDX target's mode byte."""
import gzip
import json
import os
import struct
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def gz(data):
    return gzip.compress(data, compresslevel=6, mtime=0)


def idx(dims, payload=None):
    head = bytes([0, 0, 8, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims)
    if payload is None:
        n = 1
        for d in dims:
            n *= d
        payload = bytes((i * 37) % 256 for i in range(n))
    return head + payload


def mode(ndim, compress_here=False):
    return bytes([((ndim - 1) << 1) | (1 if compress_here else 0)])


# ---- idx: mode byte, then the file (or, with bit 0, the data the harness gzips) ----
labels = idx([6])
images = idx([2, 4, 3])
write("idx", "labels_plain", mode(1) + labels)
write("idx", "labels_gz", mode(1) + gz(labels))
write("idx", "labels_gz_by_harness", mode(1, True) + labels)
write("idx", "images_plain", mode(3) + images)
write("idx", "images_gz", mode(3) + gz(images))
write("idx", "images_gz_by_harness", mode(3, True) + images)
write("idx", "images_gz_two_members", mode(3) + gz(images[:9]) + gz(images[9:]))
write("idx", "four_dims_plain", mode(4) + idx([1, 2, 2, 2]))
write("idx", "claims_2e31_images_plain", mode(3) + idx([1 << 31, 28, 28], b"\x00" * 16))
write("idx", "claims_2e31_images_gz", mode(3) + gz(idx([1 << 31, 28, 28], b"\x00" * 16)))
write("idx", "truncated_plain", mode(3) + images[:-3])
write("idx", "trailing_plain", mode(1) + labels + b"\x01\x02")
write("idx", "wrong_magic", mode(1) + b"\x00\x00\x09\x01" + labels[4:])
write("idx", "gz_trailing_garbage", mode(1) + gz(labels) + b"junk")
# Gzip bombs in miniature (inputs are at most 4 KiB): a header claiming 2^31 images over 1 MB of
# zeros (refused from the header: deflate cannot expand 1 KB that far), and a plausible claim of
# 1000 labels over the same zeros (refused at the first byte past the claim).
write("idx", "bomb_claims_2e31_images_gz", mode(3) + gz(idx([1 << 31, 28, 28], b"")[:16] + b"\x00" * (1 << 20)))
write("idx", "bomb_labels_past_claim_gz", mode(1) + gz(idx([1000], b"\x00" * 1000) + b"\x00" * (1 << 20)))
# Reading a prefix (mode bit 3: a limit of 1 + (mode >> 4)): two of four images.
limited = bytes([mode(3)[0] | 8 | (1 << 4)])
write("idx", "images_gz_limit_2", limited + gz(idx([4, 4, 3])))
write("idx", "images_plain_limit_2", limited + idx([4, 4, 3]))


# ---- safetensors: the file ----
def safetensors(tensors, metadata=None, pad=True):
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


def crc_of(tensors, metadata):
    """The checksum of Note [Checksum] in engine/io/safetensors.cpp."""
    crc = 0
    field = lambda s: s.encode() + b"\x00"
    for name, dtype, shape, raw in tensors:
        crc = zlib.crc32(field(name) + field(dtype) + field("[" + ", ".join(str(d) for d in shape) + "]"), crc)
    for k in sorted(metadata):
        if k != "checksum_crc32":
            crc = zlib.crc32(field(k) + field(metadata[k]), crc)
    for _, _, _, raw in tensors:
        crc = zlib.crc32(raw, crc)
    return "%08x" % crc


t = [
    ("linear.weight", "F32", [2, 3], struct.pack("<6f", 0.5, -1.0, 2.0, 0.0, 1.5, -0.25)),
    ("linear.bias", "F32", [2], struct.pack("<2f", 0.1, -0.1)),
    ("labels", "I32", [3], struct.pack("<3i", 1, -2, 3)),
    ("bytes", "U8", [4], bytes([0, 7, 128, 255])),
    ("scalar", "F32", [], struct.pack("<f", 3.0)),
    ("empty", "F32", [0, 5], b""),
]
write("safetensors", "mixed", safetensors(t, {"format": "pt"}))
write("safetensors", "no_metadata", safetensors(t[:2]))
write("safetensors", "unpadded", safetensors(t[:1], pad=False))
write("safetensors", "only_metadata", safetensors([], {"format": "pt"}))
meta = {"format": "cumulus-checkpoint-1", "epoch": "1", "checksum_crc32": ""}
meta["checksum_crc32"] = crc_of(t[:3], meta)
write("safetensors", "with_checksum", safetensors(t[:3], meta))
write("safetensors", "truncated", safetensors(t[:2])[:-5])
overlap = b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}}'
write("safetensors", "overlap", struct.pack("<Q", len(overlap)) + overlap + b"\x00" * 6)
# Regressions: a shape whose product overflows before a zero dimension (Shape::numel overflowed);
# a header with a NUL byte (the JSON parser stops at it, so trailing garbage passed).
raw = b'{"a":{"dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}}'
write("safetensors", "shape_overflow_then_zero", struct.pack("<Q", len(raw)) + raw)
raw = b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}\x00junk'
write("safetensors", "nul_in_header", struct.pack("<Q", len(raw)) + raw + b"\x05")

# Hostile nesting: refused before parsing (more than 8 deep), whatever the value.
deep = b"[" * 1500 + b"1" + b"]" * 1500
raw = b'{"a":{"dtype":"F32","shape":' + deep + b',"data_offsets":[0,4]}}'
write("safetensors", "deep_shape", struct.pack("<Q", len(raw)) + raw + b"\x00" * 4)
raw = b'{"__metadata__":{"k":' + b'{"a":' * 600 + b'"v"' + b"}" * 600 + b"}}"
write("safetensors", "deep_metadata", struct.pack("<Q", len(raw)) + raw)
raw = b'{"__metadata__":{"k":"[[[[[[[[[[[[\\"{{{{{{{{{{\\\\"},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'
write("safetensors", "brackets_in_strings", struct.pack("<Q", len(raw)) + raw + b"\x01")
# Dtypes converted on load: F16 (zero, -0, 1, smallest subnormal, largest, inf, -inf, NaN) and F64
# to f32, I64 to i32 (one file in range, one not), BF16 as raw bits.
f16 = struct.pack("<8H", 0x0000, 0x8000, 0x3C00, 0x0001, 0x7BFF, 0x7C00, 0xFC00, 0x7E00)
write("safetensors", "f16", safetensors([("h", "F16", [8], f16)]))
write("safetensors", "bf16", safetensors([("b", "BF16", [2, 2], struct.pack("<4H", 0x3F80, 0xC000, 0x7F80, 0x7FC1))]))
write("safetensors", "f64", safetensors([("d", "F64", [4], struct.pack("<4d", 0.1, 1e300, -0.0, 1 + 2 ** -24))]))
write("safetensors", "i64", safetensors([("n", "I64", [3], struct.pack("<3q", 0, -(2 ** 31), 2 ** 31 - 1))]))
write("safetensors", "i64_out_of_range", safetensors([("n", "I64", [2], struct.pack("<2q", 1, 2 ** 31))]))
t16 = [("h", "F16", [8], f16), ("n", "I64", [1], struct.pack("<q", 7))]
meta = {"format": "pt", "checksum_crc32": ""}
meta["checksum_crc32"] = crc_of(t16, meta)
write("safetensors", "f16_i64_with_checksum", safetensors(t16, meta))

# ---- size: the text ----
for i, s in enumerate(["64MiB", "1.5GiB", "0", "12", "512 KiB", "1 KB", "9e18", "1e400", "-1", "0x10",
                       "nan", "3.5", "2TiB", "7 B", ""]):
    write("size", "s%02d" % i, s.encode())
