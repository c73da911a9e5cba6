#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_rpc (tests/fuzz/corpus/fuzz_rpc/).

Each seed is the target's input: one byte for the method (kilnd's table
order), then the request, protobuf-encoded here by hand (no protobuf
package needed). PutBuffer seeds are sequences of 2-byte little-endian
lengths and messages. 32 'H' stand for a live buffer handle and 64 'E' for
the id of the executable the target compiles at start (see fuzz_rpc.c).
Run it again after changing the requests; the files are committed.
"""
import os
import struct
import sys

COMPILE, EXECUTE, PUT, GET, RELEASE, STATS, HEALTH, CLIST, CEVICT, UNKNOWN = range(10)
HANDLE = b"H" * 32
EXE = b"E" * 64
F32 = 16


def varint(n):
    n &= (1 << 64) - 1
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def field(num, value):
    """A field: int -> varint, bytes/str -> length-delimited."""
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int):
        return varint(num << 3) + varint(value)
    if isinstance(value, str):
        value = value.encode()
    return varint(num << 3 | 2) + varint(len(value)) + value


def msg(*fields):
    return b"".join(fields)


def shape(etype, dims):
    return msg(field(1, etype), field(2, msg(*[varint(d) for d in dims])) if dims else b"")


def literal_f32(vals):
    return msg(field(1, shape(F32, [len(vals)])), field(2, struct.pack("<%df" % len(vals), *vals)))


AXPY = ("HloModule seed_axpy\nENTRY main {\n  a = f32[] parameter(0)\n"
        "  x = f32[4] parameter(1)\n  y = f32[4] parameter(2)\n"
        "  ab = f32[4] broadcast(a), dimensions={}\n  ax = f32[4] multiply(ab, x)\n"
        "  ROOT r = f32[4] add(ax, y)\n}\n")
LOOP = ("HloModule seed_loop\ncond {\n  s = (s32[], s32[]) parameter(0)\n"
        "  i = s32[] get-tuple-element(s), index=0\n  n = s32[] get-tuple-element(s), index=1\n"
        "  ROOT lt = pred[] compare(i, n), direction=LT\n}\n"
        "body {\n  s = (s32[], s32[]) parameter(0)\n  i = s32[] get-tuple-element(s), index=0\n"
        "  n = s32[] get-tuple-element(s), index=1\n  one = s32[] constant(1)\n"
        "  i1 = s32[] add(i, one)\n  ROOT t = (s32[], s32[]) tuple(i1, n)\n}\n"
        "ENTRY main {\n  n = s32[] parameter(0)\n  zero = s32[] constant(0)\n"
        "  init = (s32[], s32[]) tuple(zero, n)\n"
        "  loop = (s32[], s32[]) while(init), condition=cond, body=body\n"
        "  ROOT i = s32[] get-tuple-element(loop), index=0\n}\n")
TUPLE = ("HloModule seed_tuple\nENTRY main {\n  x = f32[4] parameter(0)\n"
         "  n = f32[4] negate(x)\n  ROOT t = (f32[4], f32[4]) tuple(x, n)\n}\n")


def options(backend="interp", transforms=b"", level=None):
    fs = [field(1, backend)]
    if transforms:
        fs.append(field(5, transforms))
    if level is not None:
        fs += [field(6, level), field(7, True)]
    return msg(*fs)


def put_stream(*messages):
    return b"".join(struct.pack("<H", len(m)) + m for m in messages)


def header(etype, dims, device=0, label=""):
    fs = [field(1, shape(etype, dims))]
    if device:
        fs.append(field(2, device))
    if label:
        fs.append(field(3, label))
    return msg(*fs)


def execute(args, keep=(), devices=()):
    fs = [field(1, EXE)]
    fs += [field(2, a) for a in args]
    fs += [field(3, k) for k in keep]
    fs += [field(4, d) for d in devices]
    return msg(*fs)


def arg_literal(vals):
    return msg(field(1, literal_f32(vals)))


def arg_handle(donate=False):
    return msg(field(2, HANDLE), field(3, donate)) if donate else msg(field(2, HANDLE))


SEEDS = {
    "compile_axpy": (COMPILE, msg(field(1, AXPY), field(3, options()))),
    "compile_loop": (COMPILE, msg(field(1, LOOP), field(3, options(level=0)))),
    "compile_tuple": (COMPILE, msg(field(1, TUPLE), field(3, options()), field(4, "req-1"))),
    "compile_grad": (COMPILE, msg(field(1, "HloModule g\nENTRY main {\n  x = f32[] parameter(0)\n"
                                          "  ROOT y = f32[] multiply(x, x)\n}\n"),
                                  field(3, options(transforms=field(1, b""))))),
    "compile_bad_text": (COMPILE, msg(field(1, "HloModule bad\nENTRY main {\n  ROOT x = f32[4"))),
    "compile_empty": (COMPILE, b""),
    "execute_literal": (EXECUTE, execute([arg_literal([1, 2, 3, 4])])),
    "execute_keep": (EXECUTE, execute([arg_literal([1, 2, 3, 4])], keep=[True])),
    "execute_handle": (EXECUTE, execute([arg_handle()])),
    "execute_donate": (EXECUTE, execute([arg_handle(donate=True)])),
    "execute_wrong_shape": (EXECUTE, execute([arg_literal([1, 2])])),
    "execute_devices": (EXECUTE, execute([arg_literal([1, 2, 3, 4])], devices=[1])),
    "execute_unknown_id": (EXECUTE, msg(field(1, "0" * 64), field(2, arg_literal([1, 2, 3, 4])))),
    "put_one_chunk": (PUT, put_stream(msg(field(1, header(F32, [4], label="seed")),
                                          field(2, struct.pack("<4f", 1, 2, 3, 4))))),
    "put_two_chunks": (PUT, put_stream(msg(field(1, header(F32, [4]))),
                                       msg(field(2, struct.pack("<2f", 1, 2))),
                                       msg(field(2, struct.pack("<2f", 3, 4))))),
    "put_no_header": (PUT, put_stream(msg(field(2, b"\0" * 16)))),
    "put_short": (PUT, put_stream(msg(field(1, header(F32, [8])), field(2, b"\0" * 12)))),
    "put_interp_device": (PUT, put_stream(msg(field(1, header(F32, [4], device=1)),
                                              field(2, b"\0" * 16)))),
    "get_handle": (GET, msg(field(1, HANDLE))),
    "get_small_chunks": (GET, msg(field(1, HANDLE), field(2, 4))),
    "get_release": (GET, msg(field(1, HANDLE), field(3, True))),
    "get_unknown": (GET, msg(field(1, "f" * 32))),
    "release_handle": (RELEASE, msg(field(1, HANDLE), field(1, HANDLE), field(1, "x"))),
    "stats": (STATS, b""),
    "health": (HEALTH, b""),
    "health_service": (HEALTH, msg(field(1, "kiln.v1.Kiln"))),
    "cache_list": (CLIST, msg(field(2, 10))),
    "cache_list_keys": (CLIST, msg(field(1, "a" * 64), field(1, "nothex"))),
    "cache_evict_key": (CEVICT, msg(field(1, EXE))),
    "cache_evict_all": (CEVICT, msg(field(2, True))),
    "unknown_method": (UNKNOWN, b"\x0a\x00"),
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "corpus", "fuzz_rpc")
    os.makedirs(out, exist_ok=True)
    for name, (method, body) in sorted(SEEDS.items()):
        with open(os.path.join(out, name), "wb") as f:
            f.write(bytes([method]) + body)
    print("%d seeds in %s" % (len(SEEDS), out))


if __name__ == "__main__":
    main()
