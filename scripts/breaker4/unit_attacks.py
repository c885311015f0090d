"""Compare entries_of (fast path) with parse_entry per item on crafted pages. Not run by CI."""
from publisher.entries import Page, entries_of, parse_entry

D = b'{"type":"block.delta","seq":%d,"ts":1,"block":{"id":"b0","index":0,"kind":"text"}}'
def ev(s): return D % s

CASES = {
    "1],[2": [ev(1), b"1],[2", ev(3)],
    "close bracket": [ev(1), b'{"type":"block.delta"}]', ev(3)],
    "lone ]": [ev(1), b"]", ev(3)],
    ",{}": [ev(1), b",{}", ev(3)],
    "trailing ws": [ev(1), b'{"type":"x"} ', b'{"type":"block.delta"}\t ', ev(4)],
    "trailing comma": [ev(1), b'{"type":"block.delta"},', ev(3)],
    "] in string": [ev(1), b'{"type":"block.delta","t":"]],[{"}', ev(3)],
    "non-utf8": [ev(1), b'{"type":"block.delta","t":"\xff\xfe"}', ev(3)],
    "nul": [ev(1), b'{"type":"block.delta","t":"a\x00b"}', b'{"type":"block.delta"}\x00', ev(4)],
    "huge": [ev(1), b'{"type":"block.delta","t":"' + b"a" * 5_000_000 + b'"}', ev(3)],
    "deep": [ev(1), b'{"type":"block.delta","t":' + b"[" * 5000 + b"]" * 5000 + b"}", ev(3)],
    "ts overflow": [ev(1), b'{"type":"block.delta","ts":99999999999999999999999}', ev(3)],
    "ts float": [ev(1), b'{"type":"block.delta","ts":1.5}', ev(3)],
    "index overflow": [ev(1), b'{"type":"block.delta","block":{"index":1e400,"kind":"text"}}', ev(3)],
    "index -huge": [ev(1), b'{"type":"block.delta","block":{"index":-99999999999999999999,"kind":"text"}}', ev(3)],
    "dup keys": [ev(1), b'{"type":"stream.done","type":"block.delta"}', b'{"type":"block.delta","type":"stream.done"}'],
    "type not str": [ev(1), b'{"type":5}', ev(3)],
    "type null": [ev(1), b'{"type":null}', ev(3)],
    "shift via string": [b'{"type":"block.delta","x":"', b'"}', b'{"type":"block.delta"},{"type":"block.delta"}'],
    "shift via array": [b'{"type":"block.delta","x":[1', b'2]}', b'{"type":"stream.start"},{"type":"block.delta"}'],
    "shift terminal": [b'{"type":"block.delta","x":"', b'","y":{"type":"stream.done"}}', b'{"type":"stream.done"},{"type":"block.delta"}', ev(4)],
    "bom": [ev(1), b'\xef\xbb\xbf{"type":"block.delta"}', ev(3)],
    "empty+two": [b'', ev(2) + b"," + ev(3)],
}

bad = 0
for name, items in CASES.items():
    raw = [(b"0-%d" % (i + 1), [b"e", it]) for i, it in enumerate(items)]
    try:
        careful = Page(parse_entry(eid, f) for eid, f in raw)
    except Exception as exc:
        print(f"CAREFUL CRASH {name}: {exc!r}"); careful = None
    try:
        page = entries_of("st_x", raw)
    except Exception as exc:
        print(f"CRASH {name}: {exc!r}"); bad += 1; continue
    if careful is None:
        print(f"   fast gave {[e.type for e in page]}"); bad += 1; continue
    ok = list(page) == list(careful) and page.frames() == careful.frames()
    if not ok:
        bad += 1
        print(f"MISMATCH {name}")
        for a, b in zip(page, careful):
            if a != b:
                print("   fast   ", a.seq, a.type, a.frame[:90])
                print("   careful", b.seq, b.type, b.frame[:90])
    else:
        print(f"ok {name}")
print("mismatches:", bad)
