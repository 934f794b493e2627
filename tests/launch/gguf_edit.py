"""For gguf_export_llama_cpp_test: rewrites a GGUF file's header (no dtrain
code), the tensors' data kept as they are.
  gguf_edit.py IN.gguf DROP NEW=OLD CUT.gguf MORE.gguf
CUT.gguf: IN without tensor DROP's info; MORE.gguf: IN with one more tensor
NEW (OLD's dims, type and data)."""
import struct, sys
raw = open(sys.argv[1], "rb").read()
at = 24
n_t, n_kv = struct.unpack_from("<QQ", raw, 8)
size = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
def skip(t):
    global at
    if t == 8:
        at += 8 + struct.unpack_from("<Q", raw, at)[0]
    elif t == 9:
        et, n = struct.unpack_from("<IQ", raw, at)
        at += 12
        for _ in range(n):
            skip(et)
    else:
        at += size[t]
for _ in range(n_kv):
    skip(8)
    t = struct.unpack_from("<I", raw, at)[0]
    at += 4
    skip(t)
kv_end, infos = at, []
for _ in range(n_t):
    start = at
    n = struct.unpack_from("<Q", raw, at)[0]
    name = raw[at + 8:at + 8 + n].decode()
    at += 8 + n
    nd = struct.unpack_from("<I", raw, at)[0]
    at += 4 + 8 * nd + 4 + 8
    infos.append((name, raw[start:at]))
data = raw[(at + 31) // 32 * 32:]
def write(path, infos):
    h = bytearray(raw[:kv_end])
    struct.pack_into("<Q", h, 8, len(infos))
    for _, b in infos:
        h += b
    h += b"\0" * (-len(h) % 32)
    open(path, "wb").write(bytes(h) + data)
drop, extra = sys.argv[2], sys.argv[3]  # the tensor to leave out; NEW=OLD to add
write(sys.argv[4], [i for i in infos if i[0] != drop])
new, old = extra.split("=")
b = dict(infos)[old]
nb = struct.pack("<Q", len(new)) + new.encode() + b[8 + len(old):]
write(sys.argv[5], infos + [(new, nb)])
